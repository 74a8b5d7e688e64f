"""ModelRunner end to end on stories260K: greedy text, and identical logits however a step is cut."""

from __future__ import annotations

import pytest
import torch
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.serving.sampling_params import SamplingParams
from kvmesh.replica.step.scheduler_output import ScheduledRequest, SchedulerOutput
from kvmesh.replica.worker.input_batch import prepare_inputs
from kvmesh.replica.worker.model_runner import ModelRunner

GREEDY = SamplingParams(temperature=0.0, max_tokens=64)
ONCE_UPON_A_TIME = [1, 403, 407, 261, 378]  # "<s> Once upon a time" with the stories260K tokenizer
LILY = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
        "One day, she saw a big, red ball.")


@pytest.fixture(scope="module")
def runner(stories_path, device) -> ModelRunner:
    """On the test device (CUDA where there is one); the torch backend, whose cache layout a test reads."""
    return ModelRunner(EngineConfig(model=str(stories_path), dtype="float32", device=device, attention_backend="torch",
                                    kv_cache_memory=1 << 22, block_size=4))


def step(runner, *reqs: ScheduledRequest) -> dict[str, int]:
    return runner.execute_model(SchedulerOutput(list(reqs), sum(len(r.token_ids) for r in reqs)))


@torch.inference_mode()
def last_logits(runner, *reqs: ScheduledRequest) -> dict[str, torch.Tensor]:
    """Logits of each request's last token of the step."""
    inputs = prepare_inputs(list(reqs), runner.block_size, runner.device)
    hidden = runner.model(inputs.input_ids, inputs.positions, runner.attn_backend.build(inputs.common))
    logits = runner.model.compute_logits(hidden[inputs.logits_indices])
    return {rid: logits[i] for i, rid in enumerate(inputs.sample_request_ids)}


def prompt(n: int, offset: int = 0) -> list[int]:
    return [1] + [(7 * i + 3 + offset) % 500 + 3 for i in range(n - 1)]


def test_greedy_decode_tells_the_lily_story_like_transformers(runner, stories_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokens, out, blocks = list(ONCE_UPON_A_TIME), [], list(range(1, 13))
    computed = 0
    for _ in range(40):
        req = ScheduledRequest("a", tokens[computed:], computed, blocks, True, GREEDY, list(out))
        computed = len(tokens)
        out.append(step(runner, req)["a"])
        tokens.append(out[-1])
    hf = AutoModelForCausalLM.from_pretrained(stories_path, dtype=torch.float32)
    expected = hf.generate(torch.tensor([ONCE_UPON_A_TIME]), max_new_tokens=40, do_sample=False)[0].tolist()
    assert tokens == expected
    text = AutoTokenizer.from_pretrained(stories_path).decode(tokens, skip_special_tokens=True)
    assert text == LILY


def test_cached_prefix_gives_same_logits_as_computing_it(runner):
    p = prompt(30)
    full = last_logits(runner, ScheduledRequest("full", p, 0, list(range(1, 9)), True, GREEDY))["full"]
    # another request reuses the first 6 blocks (24 tokens) as its cached prefix
    shared = list(range(1, 7)) + [20, 21]
    cached = last_logits(runner, ScheduledRequest("hit", p[24:], 24, shared, True, GREEDY))["hit"]
    torch.testing.assert_close(cached, full, atol=1e-5, rtol=1e-5)


def test_chunked_prefill_matches_unchunked(runner):
    p = prompt(45, offset=11)
    full = last_logits(runner, ScheduledRequest("u", p, 0, list(range(30, 42)), True, GREEDY))["u"]
    blocks = list(range(42, 54))
    for start, end in ((0, 13), (13, 29), (29, 40)):  # chunk boundaries inside blocks
        step(runner, ScheduledRequest("c", p[start:end], start, blocks, False, GREEDY))
    chunked = last_logits(runner, ScheduledRequest("c", p[40:], 40, blocks, True, GREEDY))["c"]
    torch.testing.assert_close(chunked, full, atol=1e-5, rtol=1e-5)


def test_mixed_prefill_and_decode_batch_matches_one_at_a_time(runner):
    a, b, c = prompt(20, 1), prompt(33, 2), prompt(9, 3)
    ba, bb, bc = list(range(60, 66)), list(range(66, 76)), list(range(76, 80))
    # a and b prefilled earlier (b partly); c is new
    step(runner, ScheduledRequest("a", a[:-1], 0, ba, False, GREEDY))
    step(runner, ScheduledRequest("b", b[:17], 0, bb, False, GREEDY))
    batch = [ScheduledRequest("b", b[17:], 17, bb, True, GREEDY),
             ScheduledRequest("a", a[-1:], 19, ba, True, GREEDY),
             ScheduledRequest("c", c, 0, bc, True, GREEDY)]
    together = last_logits(runner, *batch)
    for req in batch:
        alone = last_logits(runner, req)[req.request_id]
        torch.testing.assert_close(together[req.request_id], alone, atol=1e-5, rtol=1e-5)


def test_execute_model_samples_only_requests_that_reach_their_end(runner):
    got = step(runner, ScheduledRequest("x", prompt(8), 0, [90, 91], False, GREEDY),
               ScheduledRequest("y", prompt(5), 0, [92, 93], True, GREEDY))
    assert set(got) == {"y"} and 0 <= got["y"] < runner.vocab_size


def test_runner_reports_capacity_and_model_facts(runner):
    # 4 MiB / (5 layers * 2 * 4 tokens * 4 heads * 8 dims * 4 bytes) = 819 blocks, block 0 included
    assert runner.num_kv_blocks == (1 << 22) // (5 * 2 * 4 * 4 * 8 * 4)
    assert runner.max_model_len == 512 and runner.vocab_size == 512
    assert 2 in runner.eos_token_ids
    assert tuple(runner.kv_cache.shape) == (5, 2, 4, runner.num_kv_blocks, 4, 8)  # torch backend: head-major
