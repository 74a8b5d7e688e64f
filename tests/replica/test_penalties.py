"""Presence, frequency and repetition penalties and min_p: vLLM's formula on the logits, the runner's device state
(counts kept across steps, refilled from a request's tokens), the meta device, and transformers' greedy tokens."""

from __future__ import annotations

import numpy as np
import pytest
from kvmesh.replica.serving.sampling_params import SamplingParams, SamplingParamsError
from kvmesh.replica.step.scheduler_output import ScheduledRequest, SchedulerOutput

torch = pytest.importorskip("torch")

from kvmesh.replica.sample.fixed_sampler import fixed_settings  # noqa: E402
from kvmesh.replica.sample.penalties import apply_min_p, apply_penalties  # noqa: E402
from kvmesh.replica.sample.sampler import Sampler  # noqa: E402
from kvmesh.replica.worker.input_batch import InputBatch  # noqa: E402

V = 50


def reference(logits: torch.Tensor, prompts, outputs, params) -> torch.Tensor:
    """vLLM's formula, one row and one token at a time."""
    out = logits.clone()
    for r, sp in enumerate(params):
        counts = np.bincount(outputs[r], minlength=V)
        for t in range(V):
            x = out[r, t].item()
            if t in prompts[r] or counts[t] > 0:
                x = x / sp.repetition_penalty if x > 0 else x * sp.repetition_penalty
            x -= sp.frequency_penalty * counts[t] + sp.presence_penalty * (counts[t] > 0)
            out[r, t] = x
    return out


def batch_of(params, prompts, outputs, device=torch.device("cpu")) -> tuple[InputBatch, np.ndarray]:
    batch = InputBatch(len(params), 1, 16, device)
    srs = [ScheduledRequest(f"r{i}", [1], 3, [1], True, sp, list(outputs[i]), None, list(prompts[i]))
           for i, sp in enumerate(params)]
    inputs = batch.prepare(SchedulerOutput(srs, len(srs)))
    return batch, inputs.sample_rows


def mixed_params():
    return [SamplingParams(temperature=0.0, repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=-0.7),
            SamplingParams(temperature=0.0),  # no penalty
            SamplingParams(temperature=0.0, frequency_penalty=-1.5),
            SamplingParams(temperature=0.0, presence_penalty=2.0, repetition_penalty=0.6),
            SamplingParams(temperature=0.0, repetition_penalty=1.0)]  # none either


def test_penalized_logits_match_vllms_formula_on_a_mixed_batch():
    rng = np.random.default_rng(0)
    params = mixed_params()
    prompts = [rng.integers(0, V, 7).tolist() for _ in params]
    outputs = [rng.integers(0, V, rng.integers(0, 12)).tolist() for _ in params]
    batch, rows = batch_of(params, prompts, outputs)
    md = batch.sampling_metadata(rows, V, [])
    logits = torch.randn(len(params), V, generator=torch.Generator().manual_seed(1))
    got = logits.clone()
    apply_penalties(got, md.penalties)
    torch.testing.assert_close(got, reference(logits, prompts, outputs, params))
    assert md.penalties.rows.tolist() == [0, 2, 3]
    assert Sampler()(logits, md).tolist() == reference(logits, prompts, outputs, params).argmax(-1).tolist()


def test_counts_follow_sampled_tokens_on_the_device_across_steps():
    params = [SamplingParams(temperature=0.0, frequency_penalty=1.0)]
    batch, rows = batch_of(params, [[1, 2]], [[4]])
    batch.sampling_metadata(rows, V, [])
    for token in (4, 9, 4):
        batch.count_samples(rows, torch.tensor([token]))
    counts = batch.sampling_metadata(rows, V, []).penalties.counts[0]
    assert counts[4].item() == 3 and counts[9].item() == 1 and counts.sum().item() == 4


def test_a_refilled_row_counts_from_the_requests_tokens():
    """Preemption and resume, or a new request in the row: the counts are the request's, nothing left over."""
    params = [SamplingParams(temperature=0.0, presence_penalty=1.0)]
    batch, rows = batch_of(params, [[1]], [[5, 5]])
    batch.sampling_metadata(rows, V, [])
    batch.count_samples(rows, torch.tensor([7]))
    sr = ScheduledRequest("r0", [3], 3, [1], True, params[0], [6], None, [2])
    batch.prepare(SchedulerOutput([sr], 1))
    pen = batch.sampling_metadata(rows, V, []).penalties
    assert pen.counts[0].nonzero().flatten().tolist() == [6]
    assert pen.prompt_mask[0].nonzero().flatten().tolist() == [2]


def test_greedy_takes_the_argmax_after_penalties():
    params = [SamplingParams(temperature=0.0, presence_penalty=2.0)]
    batch, rows = batch_of(params, [[0]], [[3]])
    logits = torch.zeros(1, V)
    logits[0, 3], logits[0, 8] = 1.0, 0.5
    assert Sampler()(logits, batch.sampling_metadata(rows, V, [])).tolist() == [8]


def test_min_p_drops_tokens_below_its_share_of_the_top_probability():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.5, 0.3, 0.15, 0.05]]))
    kept = apply_min_p(logits, torch.tensor([0.5, 0.0])).isfinite()
    assert kept.tolist() == [[True, True, False, False], [True] * 4]


def test_min_p_rows_never_draw_a_dropped_token():
    params = [SamplingParams(temperature=1.0, seed=s, min_p=0.5) for s in range(64)]
    batch, rows = batch_of(params, [[0]] * 64, [[]] * 64)
    logits = torch.log(torch.tensor([0.4, 0.3, 0.1, 0.1, 0.1])).repeat(64, 1)
    tokens = Sampler()(logits, batch.sampling_metadata(rows, 5, []))
    assert set(tokens.tolist()) == {0, 1}


def test_penalties_run_on_the_meta_device():
    meta = torch.device("meta")
    params = mixed_params()
    batch, rows = batch_of(params, [[1, 2]] * 5, [[3]] * 5, device=meta)
    md = batch.sampling_metadata(rows, V, [])
    tokens = Sampler()(torch.zeros(5, V, device=meta), md)
    batch.count_samples(rows, tokens)
    assert tokens.device == meta and md.penalties.counts.device == meta


def test_penalized_rows_leave_the_graph_sampler():
    """The static path hands such rows to the eager sampler, so the two give the same tokens."""
    assert fixed_settings([SamplingParams(repetition_penalty=1.2)], [0], None) is None
    assert fixed_settings([SamplingParams(min_p=0.1)], [0], None) is None


@pytest.mark.parametrize("field, value", [("frequency_penalty", 2.5), ("presence_penalty", -2.1),
                                          ("repetition_penalty", 0.0), ("min_p", 1.5), ("min_p", -0.1)])
def test_values_outside_vllms_ranges_name_the_field(field, value):
    with pytest.raises(SamplingParamsError) as e:
        SamplingParams(**{field: value})
    assert e.value.param == field


def test_greedy_repetition_penalty_matches_transformers(stories_path):
    transformers = pytest.importorskip("transformers")
    from kvmesh.replica.llm import LLM

    hf = transformers.AutoModelForCausalLM.from_pretrained(stories_path, dtype=torch.float32).eval()
    llm = LLM(str(stories_path), dtype="float32", kv_cache_memory=1 << 22, max_num_batched_tokens=8)
    prompts = ["Once upon a time", "Tom and Sue went to the park. They saw a big dog."]
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True,
                                                repetition_penalty=1.3))
    plain = llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True))[0]
    for out in outs:
        ids = torch.tensor([out.prompt_token_ids])
        ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=48, do_sample=False,
                          repetition_penalty=1.3, pad_token_id=0, eos_token_id=None)[0, ids.shape[1]:].tolist()
        assert out.output_token_ids == ref
    assert plain.output_token_ids != outs[0].output_token_ids  # the penalty changed the story


def test_penalties_survive_preemption_and_async_scheduling(stories_path):
    """Rows refilled on resume count the request's tokens: a cache small enough to preempt, sync and async, gives
    the tokens of a roomy run."""
    from .test_engine_async_scheduling import PROMPTS, both, engine, generate

    params = {rid: SamplingParams(temperature=0.0 if rid in "ac" else 0.8, seed=2, max_tokens=28, ignore_eos=True,
                                  repetition_penalty=1.3, frequency_penalty=0.4 if rid in "ab" else 0.0,
                                  presence_penalty=-0.5 if rid == "c" else 0.0)
              for rid in PROMPTS}
    roomy = generate(engine(stories_path, False), params)
    sync, async_, eng = both(stories_path, params, engine_kw={"num_kv_blocks": 24})
    assert async_ == sync == roomy
    assert eng.get_stats().num_preemptions > 0
