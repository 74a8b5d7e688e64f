"""Logprobs and prompt logprobs equal log_softmax of Hugging Face transformers' logits (the external
reference) on stories260K: generated tokens, echoed prompt tokens, chunked prefills, prefix-cache hits."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from kvmesh.replica.llm import LLM  # noqa: E402
from kvmesh.replica.serving.sampling_params import SamplingParams  # noqa: E402

TOL = 1e-4
# 40+ tokens: more than two 16-token blocks, and more than one 16-token prefill chunk.
STORY = ("Once upon a time, there was a little girl named Lily. She loved to play in the park with her "
         "big red ball. One day, she saw a dog.")


@pytest.fixture(scope="module")
def hf(stories_path):
    return transformers.AutoModelForCausalLM.from_pretrained(stories_path, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def llm(stories_path):
    # max_num_batched_tokens=16: the prompt is prefilled in chunks, so a chunk's last row waits for the next
    return LLM(str(stories_path), dtype="float32", kv_cache_memory=1 << 22, max_num_batched_tokens=16,
               debug_check_integrity=True)


def reference_logprobs(hf, token_ids: list[int]) -> torch.Tensor:
    """[len, V]: row p is log P(next token | token_ids[:p + 1]) under transformers."""
    with torch.no_grad():
        return torch.log_softmax(hf(torch.tensor([token_ids])).logits[0].float(), dim=-1)


def assert_entry_matches(entry, ref_row: torch.Tensor, token_id: int, k: int) -> None:
    assert entry.token_ids[0] == token_id
    assert entry.logprob == pytest.approx(ref_row[token_id].item(), abs=TOL)
    top = ref_row.topk(k)
    assert entry.token_ids[1:] == top.indices.tolist()
    assert entry.logprobs[1:] == pytest.approx(top.values.tolist(), abs=TOL)
    assert entry.rank == int((ref_row >= ref_row[token_id]).sum())


def test_generated_token_logprobs_equal_transformers(llm, hf):
    out = llm.generate(STORY, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=5))[0]
    ids = out.prompt_token_ids + out.output_token_ids
    ref = reference_logprobs(hf, ids)
    assert len(out.logprobs) == 8
    for i, entry in enumerate(out.logprobs):
        pos = len(out.prompt_token_ids) + i
        assert_entry_matches(entry, ref[pos - 1], ids[pos], 5)
        assert entry.rank == 1  # greedy picks the most likely token


def test_logprobs_are_of_the_raw_distribution_not_the_tempered_one(llm, hf):
    params = SamplingParams(temperature=1.7, top_k=3, seed=7, max_tokens=6, ignore_eos=True, logprobs=2)
    out = llm.generate(STORY, params)[0]
    ids = out.prompt_token_ids + out.output_token_ids
    ref = reference_logprobs(hf, ids)
    for i, entry in enumerate(out.logprobs):
        pos = len(out.prompt_token_ids) + i
        assert_entry_matches(entry, ref[pos - 1], ids[pos], 2)


def test_prompt_logprobs_equal_transformers_across_prefill_chunks(llm, hf):
    out = llm.generate(STORY, SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=3))[0]
    ids = out.prompt_token_ids
    assert len(ids) > 32
    ref = reference_logprobs(hf, ids)
    assert out.prompt_logprobs[0] is None
    assert len(out.prompt_logprobs) == len(ids)
    for pos in range(1, len(ids)):
        assert_entry_matches(out.prompt_logprobs[pos], ref[pos - 1], ids[pos], 3)


def test_cached_prompt_still_gets_correct_prompt_logprobs(llm, hf):
    story = STORY + " The dog was brown."  # a prompt this module has not cached yet
    first = llm.generate(story, SamplingParams(temperature=0.0, max_tokens=2))[0]
    again = llm.generate(story, SamplingParams(temperature=0.0, max_tokens=2))[0]
    assert again.num_cached_tokens >= 32  # the prompt's blocks are in the prefix cache

    out = llm.generate(story, SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=1))[0]
    assert out.num_cached_tokens == 0  # it computed every position instead of reading the cache (vLLM's rule)
    ref = reference_logprobs(hf, out.prompt_token_ids)
    for pos in range(1, len(out.prompt_token_ids)):
        assert_entry_matches(out.prompt_logprobs[pos], ref[pos - 1], out.prompt_token_ids[pos], 1)
    assert out.output_token_ids == first.output_token_ids

    after = llm.generate(story, SamplingParams(temperature=0.0, max_tokens=2))[0]
    assert after.num_cached_tokens >= 32  # the cache it found is still there for everyone else


def test_generated_logprobs_on_a_prefix_cache_hit_equal_transformers(llm, hf):
    story = STORY + " It was a happy day."
    llm.generate(story, SamplingParams(temperature=0.0, max_tokens=1))
    out = llm.generate(story, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=2))[0]
    assert out.num_cached_tokens >= 32  # generated-token logprobs need no prompt logits: the cache is read
    ids = out.prompt_token_ids + out.output_token_ids
    ref = reference_logprobs(hf, ids)
    for i, entry in enumerate(out.logprobs):
        pos = len(out.prompt_token_ids) + i
        assert_entry_matches(entry, ref[pos - 1], ids[pos], 2)


def test_batch_with_and_without_logprobs_gives_each_what_it_asked(llm, hf):
    params = [SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=1, prompt_logprobs=0),
              SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)]
    with_lp, without = llm.generate(["One day, Tom", "Lily saw a cat"], params)
    assert without.logprobs is None and without.prompt_logprobs is None
    ref = reference_logprobs(hf, with_lp.prompt_token_ids + with_lp.output_token_ids)
    n = len(with_lp.prompt_token_ids)
    for i, entry in enumerate(with_lp.logprobs):
        assert_entry_matches(entry, ref[n + i - 1], with_lp.output_token_ids[i], 1)
    for pos in range(1, n):
        entry = with_lp.prompt_logprobs[pos]
        assert len(entry.token_ids) == 1  # prompt_logprobs=0: the prompt token's own logprob only
        assert entry.logprob == pytest.approx(ref[pos - 1][with_lp.prompt_token_ids[pos]].item(), abs=TOL)


def test_logit_bias_steers_sampling_but_not_the_reported_logprobs(llm, hf):
    plain = llm.generate(STORY, SamplingParams(temperature=0.0, max_tokens=1, logprobs=0))[0]
    banned = plain.output_token_ids[0]
    forced = 100  # a token greedy decoding would not pick
    assert forced != banned
    out = llm.generate(STORY, SamplingParams(temperature=0.0, max_tokens=3, logprobs=0, ignore_eos=True,
                                             logit_bias={banned: -100.0, forced: 100.0}))[0]
    assert out.output_token_ids == [forced] * 3
    ref = reference_logprobs(hf, out.prompt_token_ids + out.output_token_ids)
    first = out.logprobs[0]
    assert first.logprob == pytest.approx(ref[len(out.prompt_token_ids) - 1][forced].item(), abs=TOL)
    assert first.rank > 1  # the raw distribution does not favour it


def test_prompt_logprobs_of_chunks_batched_behind_decoding_rows(llm, hf):
    # A decoding request takes one token of each 16-token step, so the 42-token prompt runs as chunks of
    # 11, 15, 15 and 1 tokens whose rows come after the decode rows; the last, one-token chunk is batched
    # among the decodes themselves (the persistent batch orders one-token rows first).
    runner = llm.llm_engine.model_runner
    steps = []
    execute = runner.execute_model

    def spy(out):
        steps.append(([len(sr.token_ids) for sr in out.scheduled if sr.sampling_params.prompt_logprobs],
                      len(out.decode_request_ids)))
        return execute(out)

    runner.execute_model = spy
    try:
        older = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
        newer = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True, prompt_logprobs=2)
        prompt = llm.get_tokenizer()(STORY + " Lily threw the ball and the dog ran after it.").input_ids[:42]
        assert len(prompt) == 42
        _, out = llm.generate([[1, 300, 301, 302, 303], prompt], [older, newer])
    finally:
        runner.execute_model = execute
    chunks = [(sizes[0], decodes) for sizes, decodes in steps if sizes]
    assert chunks == [(11, 0), (15, 1), (15, 1), (1, 1)]
    ref = reference_logprobs(hf, prompt)
    for pos in range(1, len(prompt)):
        assert_entry_matches(out.prompt_logprobs[pos], ref[pos - 1], prompt[pos], 2)
