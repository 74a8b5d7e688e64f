"""Sampled requests with n-gram drafts or a draft model's keep plain decoding's distribution (rejection
sampling), and the speculative decoding counters reach ``/metrics`` with vLLM's names.

The prompt quotes a greedy continuation of its own start and then that start again, so the n-gram proposer
drafts the quoted text: at temperature 0.8 over the top 3 tokens most drafts are accepted and some are
rejected and replaced by residual draws. The draft model (stories260K with noisy weights) samples its drafts
from its own distribution q, accepted with min(1, p/q). Token frequencies at each output position, over fixed seeds, are
compared between plain and speculative decoding with a chi-square test of homogeneity (threshold at 0.999).
"""

from __future__ import annotations

import math
from collections import Counter

import pytest

pytest.importorskip("torch")

from kvmesh.replica.config import EngineConfig  # noqa: E402
from kvmesh.replica.engine.engine_request import EngineRequest
from kvmesh.replica.engine.llm_engine import LLMEngine  # noqa: E402
from kvmesh.replica.server.metrics import ReplicaMetrics  # noqa: E402
from kvmesh.replica.serving.sampling_params import SamplingParams  # noqa: E402

from .draft_models import draft_spec  # noqa: E402

SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
START = [1, 403, 407, 261, 378]
NUM_REQUESTS, NUM_TOKENS = 600, 6


def engine(path, spec: dict | bool | None) -> LLMEngine:
    """``spec``: a ``speculative_config``, True for the n-gram one, None or False for none."""
    return LLMEngine(EngineConfig(model=str(path), dtype="float32", device="cpu", kv_cache_memory=1 << 24,
                                  speculative_config=SPEC if spec is True else spec or None))


def run(eng: LLMEngine, prompts: dict[str, list[int]], params: dict[str, SamplingParams]) -> dict[str, list[int]]:
    for rid, prompt in prompts.items():
        eng.add_request(EngineRequest(rid, prompt, params[rid]))
    result = {}
    for _ in range(1000):
        if not eng.has_unfinished_requests():
            break
        for out in eng.step():
            if out.finished:
                result[out.request_id] = list(out.output_token_ids)
    return result


def quoting_prompt(path) -> list[int]:
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    return START + run(engine(path, False), {"g": START}, {"g": greedy})["g"] + START


def chi_square(a: Counter, b: Counter) -> tuple[float, int]:
    """Two-sample homogeneity statistic and degrees of freedom; tokens seen fewer than 10 times pooled."""
    bins = [t for t in a.keys() | b.keys() if a[t] + b[t] >= 10]
    rows = [[a[t] for t in bins] + [a.total() - sum(a[t] for t in bins)],
            [b[t] for t in bins] + [b.total() - sum(b[t] for t in bins)]]
    cols = [x + y for x, y in zip(*rows, strict=True)]
    if cols[-1] < 5:  # nothing (or almost nothing) pooled
        rows, cols = [r[:-1] for r in rows], cols[:-1]
    n = sum(cols)
    stat = sum((obs - sum(r) * c / n) ** 2 / (sum(r) * c / n) for r in rows for obs, c in zip(r, cols, strict=True))
    return stat, len(cols) - 1


def chi2_quantile_999(df: int) -> float:
    """Wilson-Hilferty approximation of the chi-square 0.999 quantile."""
    z = 3.0902
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_sampled_token_frequencies_match_plain_decoding(stories_path, method, request):
    spec = True if method == "ngram" else draft_spec(request.getfixturevalue("perturbed_draft"), 3)
    prompt = quoting_prompt(stories_path)
    prompts = {str(i): prompt for i in range(NUM_REQUESTS)}
    params = {str(i): SamplingParams(temperature=0.8, top_k=3, max_tokens=NUM_TOKENS, ignore_eos=True, seed=i)
              for i in range(NUM_REQUESTS)}
    plain = run(engine(stories_path, False), prompts, params)
    eng = engine(stories_path, spec)
    spec = run(eng, prompts, params)
    stats = eng.scheduler.drafter.stats
    assert stats.num_draft_tokens > stats.num_accepted_tokens > 0  # drafts were both accepted and rejected
    total, df = 0.0, 0
    for pos in range(1, NUM_TOKENS):  # position 0 is sampled after the prefill, never drafted
        stat, d = chi_square(Counter(t[pos] for t in plain.values()), Counter(t[pos] for t in spec.values()))
        total, df = total + stat, df + d
    assert df >= 5
    assert total < chi2_quantile_999(df), (total, df)


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_spec_decode_counters_are_on_metrics(stories_path, method, request):
    eng = engine(stories_path, True if method == "ngram" else draft_spec(request.getfixturevalue("perturbed_draft")))
    prompt = quoting_prompt(stories_path)
    run(eng, {"q": prompt}, {"q": SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)})
    stats = eng.scheduler.drafter.stats
    assert stats.num_accepted_tokens > 0
    text = ReplicaMetrics(eng.get_stats, "m").render().decode()
    assert f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {float(stats.num_drafts)}' in text
    assert f"vllm:spec_decode_num_draft_tokens_total{{engine=\"0\",model_name=\"m\"}} " \
           f"{float(stats.num_draft_tokens)}" in text
    assert f"vllm:spec_decode_num_accepted_tokens_total{{engine=\"0\",model_name=\"m\"}} " \
           f"{float(stats.num_accepted_tokens)}" in text
    assert 'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} ' \
           f"{float(stats.accepted_per_pos[0])}" in text


def test_no_spec_decode_counters_without_speculative_config(stories_path):
    eng = engine(stories_path, False)
    assert "spec_decode" not in ReplicaMetrics(eng.get_stats, "m").render().decode()
