"""Engine-side logprobs plumbing: preemption mid-prefill, the runner output crossing a process
boundary (tensor-parallel rank 0 -> engine), and the sampler's logprob and logit_bias primitives."""

from __future__ import annotations

import pickle

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from kvmesh.replica.engine.engine_request import EngineRequest  # noqa: E402
from kvmesh.replica.llm import LLM  # noqa: E402
from kvmesh.replica.sample.logprobs import gather_logprobs  # noqa: E402
from kvmesh.replica.sample.sampler import Sampler, build_sampling_metadata  # noqa: E402
from kvmesh.replica.serving.sampling_params import SamplingParams  # noqa: E402
from kvmesh.replica.step.outputs import ModelRunnerOutput, TokenLogprobs  # noqa: E402

from ..conftest import TEST_KV_CACHE_MEMORY  # noqa: E402

STORY = ("Once upon a time, there was a little girl named Lily. She loved to play in the park with her "
         "big red ball. One day, she saw a dog.")


def test_prompt_logprobs_survive_preemption_mid_prefill(stories_path):
    # 4 usable KV blocks, 16-token chunks: the older request's decode keeps preempting the newer one's prefill
    llm = LLM(str(stories_path), dtype="float32", num_kv_blocks=5, max_num_batched_tokens=16,
              kv_cache_memory=TEST_KV_CACHE_MEMORY, debug_check_integrity=True)
    older = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    newer = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True, prompt_logprobs=1)
    _, out = llm.generate(["Tom and Sue went to the beach. They built a big", STORY], [older, newer])
    assert out.metrics.num_preemptions > 0
    hf = transformers.AutoModelForCausalLM.from_pretrained(stories_path, dtype=torch.float32).eval()
    ids = out.prompt_token_ids
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)
    assert out.prompt_logprobs[0] is None
    for pos in range(1, len(ids)):
        entry = out.prompt_logprobs[pos]
        assert entry.token_ids[0] == ids[pos]
        assert entry.logprob == pytest.approx(ref[pos - 1][ids[pos]].item(), abs=1e-4)


def test_runner_output_keeps_its_logprobs_through_pickle():
    entry = TokenLogprobs([3, 3, 9], [-0.1, -0.1, -2.0], 1)
    out = ModelRunnerOutput({"a": 3}, {"a": entry}, {"b": [(1, entry)]})
    back = pickle.loads(pickle.dumps(out))
    assert back == {"a": 3} and back.logprobs == {"a": entry} and back.prompt_logprobs == {"b": [(1, entry)]}


def test_gather_logprobs_puts_the_chosen_token_first_with_its_rank():
    logprobs = torch.log_softmax(torch.tensor([[0.0, 3.0, 1.0, 2.0]]), dim=-1)
    lp = gather_logprobs(logprobs, 2, torch.tensor([2]))
    assert lp.token_ids.tolist() == [[2, 1, 3]] and lp.ranks.tolist() == [3]
    assert lp.row(0, 1).token_ids == [2, 1]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_logit_bias_moves_the_sampled_token_and_leaves_raw_logprobs(temperature):
    logits = torch.tensor([[0.0, 5.0, 1.0, 2.0]])
    params = SamplingParams(temperature=temperature, seed=1, logprobs=1, logit_bias={0: 100.0, 1: -100.0})
    md = build_sampling_metadata([params], [0], 4, [], torch.device("cpu"))
    tokens, lp = Sampler().sample_with_logprobs(logits, md)
    assert tokens.tolist() == [0]
    raw = torch.log_softmax(logits, dim=-1)
    assert lp.logprobs[0, 0].item() == pytest.approx(raw[0, 0].item())  # before the bias (raw_logprobs)
    assert lp.token_ids[0].tolist() == [0, 1] and logits.tolist() == [[0.0, 5.0, 1.0, 2.0]]  # input untouched


def test_a_runner_without_logprobs_fails_the_request_that_asked_instead_of_dropping_them():
    from kvmesh.replica.config import EngineConfig
    from kvmesh.replica.engine.llm_engine import LLMEngine
    from kvmesh.replica.worker.fake_runner import FakeModelRunner

    engine = LLMEngine(EngineConfig(model="fake", load_format="dummy"), model_runner=FakeModelRunner(),
                       skip_tokenizer_init=True)
    engine.add_request(EngineRequest("plain", [1, 2, 3], SamplingParams(max_tokens=2)))
    engine.add_request(EngineRequest("asks", [1, 2, 3], SamplingParams(max_tokens=2, logprobs=1)))
    finals = {}
    while engine.has_unfinished_requests():
        finals.update({o.request_id: o for o in engine.step() if o.finished})
    assert finals["plain"].finish_reason == "length"
    assert finals["asks"].finish_reason == "error" and "no logprobs" in finals["asks"].error
