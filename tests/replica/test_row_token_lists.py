"""Token lists (logit_bias, allowed_token_ids, the min_tokens bans) cost a request once, not every step: a row's
arrays are made when it joins the batch, a step whose rows are unchanged reuses the last step's tensors, and the n
children of a request share one checked copy of its lists."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from kvmesh.replica.engine.engine_request import EngineRequest
from kvmesh.replica.engine.request import Request
from kvmesh.replica.engine.request_checks import validate_request_input
from kvmesh.replica.openai.errors import parse_request
from kvmesh.replica.openai.protocol import CompletionRequest
from kvmesh.replica.sample.sampler import Sampler
from kvmesh.replica.server.parallel_sampling import params_per_prompt, plan_candidates
from kvmesh.replica.serving.errors import ProtocolError
from kvmesh.replica.serving.read_only_lists import TokenBias
from kvmesh.replica.serving.sampling_params import SamplingParams
from kvmesh.replica.step.scheduler_output import ScheduledRequest, SchedulerOutput
from kvmesh.replica.worker.input_batch import InputBatch

VOCAB = 150_000  # a large tokenizer's vocabulary
ROWS = 128  # a request with n=128
ENTRIES = 20_000  # tokens in each row's lists (the sizes do not change what is asserted)


def admitted(params: list[SamplingParams], context: list[int] | None = None) -> tuple[InputBatch, np.ndarray]:
    """A batch holding one decoding row per params (row i's context is ``context[i]`` tokens, default 3; 3 blocks
    of 16 each)."""
    batch = InputBatch(len(params), 4, 16, torch.device("cpu"))
    context = context or [3] * len(params)
    srs = [ScheduledRequest(f"r{i}", [1], c, [1, 2, 3], True, sp)
           for i, (sp, c) in enumerate(zip(params, context, strict=True))]
    return batch, batch.prepare(SchedulerOutput(srs, len(srs))).sample_rows


def shared_lists_params(temperature: float = 1.0) -> SamplingParams:
    rng = np.random.default_rng(0)
    ids = rng.choice(VOCAB, ENTRIES, replace=False).tolist()
    return SamplingParams(temperature=temperature, logit_bias={t: 1.5 for t in ids}, allowed_token_ids=ids,
                          min_tokens=4, stop_token_ids=[7, 8])


def test_a_step_with_unchanged_rows_reuses_the_tensors_of_its_lists():
    batch, rows = admitted([shared_lists_params()] * ROWS)
    first = batch.sampling_metadata(rows, VOCAB, [2])
    second = batch.sampling_metadata(rows, VOCAB, [2])
    for name in ("logit_bias", "allowed", "banned"):
        old, new = getattr(first, name), getattr(second, name)
        assert old is not None and all(a is b for a, b in zip(old, new, strict=True)), name


def test_a_row_past_min_tokens_leaves_the_bans_and_keeps_its_bias():
    batch, rows = admitted([shared_lists_params(), SamplingParams(temperature=1.0, min_tokens=2, max_tokens=9)])
    first = batch.sampling_metadata(rows, VOCAB, [2])
    assert first.banned[0].tolist() == [0, 0, 0, 1]  # row 0: stop ids 7, 8 and EOS; row 1: EOS
    batch.num_output[rows[1]] = 2  # row 1 has its min_tokens
    second = batch.sampling_metadata(rows, VOCAB, [2])
    assert second.banned[0].tolist() == [0, 0, 0] and second.banned[1].tolist() == [7, 8, 2]
    assert all(a is b for a, b in zip(first.logit_bias, second.logit_bias, strict=True))


def test_lists_follow_their_rows_when_the_step_reorders_them():
    vocab = 50
    params = [SamplingParams(temperature=0.0, logit_bias={10 + i: 100.0}) for i in range(3)]
    batch, rows = admitted(params, context=[3, 3, 3])
    logits = torch.zeros(3, vocab)
    before = batch.sampling_metadata(rows, vocab, [])
    assert Sampler()(logits, before).tolist() == [10, 11, 12]
    batch.num_computed[rows[2]] = 40  # the longest context decodes first: the step's order is now 2, 0, 1
    moved = batch.prepare(SchedulerOutput([], 3, decode_request_ids=["r0", "r1", "r2"])).sample_rows
    assert moved.tolist() == [rows[2], rows[0], rows[1]]
    after = batch.sampling_metadata(moved, vocab, [])
    assert Sampler()(logits, after).tolist() == [12, 10, 11]
    assert after.logit_bias[1] is before.logit_bias[1] and after.logit_bias[2] is before.logit_bias[2]  # ids kept


def test_a_refilled_row_takes_the_lists_of_its_new_request():
    vocab = 50
    batch, rows = admitted([SamplingParams(temperature=0.0, logit_bias={5: 100.0})])
    assert Sampler()(torch.zeros(1, vocab), batch.sampling_metadata(rows, vocab, [])).tolist() == [5]
    batch.free(["r0"])
    sr = ScheduledRequest("r9", [1], 3, [1], True, SamplingParams(temperature=0.0, allowed_token_ids=[9]))
    rows = batch.prepare(SchedulerOutput([sr], 1)).sample_rows
    md = batch.sampling_metadata(rows, vocab, [])
    assert md.logit_bias is None and Sampler()(torch.zeros(1, vocab), md).tolist() == [9]


class CountedBias(TokenBias):
    """A (read-only) logit_bias that counts how often its entries are walked."""

    walks = 0

    def items(self):
        CountedBias.walks += 1
        return super().items()

    def keys(self):
        CountedBias.walks += 1
        return super().keys()

    def __iter__(self):
        CountedBias.walks += 1
        return super().__iter__()


def test_n_children_share_one_checked_copy_of_the_lists():
    CountedBias.walks = 0
    base = SamplingParams(temperature=1.0, seed=3, logit_bias=CountedBias({t: 0.5 for t in range(VOCAB)}),
                          allowed_token_ids=list(range(VOCAB)))
    walks_to_build = CountedBias.walks
    first = EngineRequest("req", [1, 2, 3], base)
    candidates = plan_candidates(first, [[1, 2, 3]], [base], ROWS, None, False)
    for c in candidates:  # what the engine checks of each request it is handed
        validate_request_input(c.request.prompt_token_ids, c.request.sampling_params, max_model_len=64,
                               vocab_size=VOCAB, block_size=16, num_usable_blocks=64, has_tokenizer=False)
    children = [c.request.sampling_params for c in candidates]
    assert [sp.seed for sp in children] == list(range(3, 3 + ROWS))
    assert all(sp.logit_bias is base.logit_bias and sp.allowed_token_ids is base.allowed_token_ids for sp in children)
    assert CountedBias.walks - walks_to_build <= 1  # the vocabulary check of the shared lists, once


def test_a_child_with_replaced_lists_is_checked_again():
    base = SamplingParams(logit_bias={3: 1.0})
    child = base.child(seed=4)
    child.logit_bias = {VOCAB: 1.0}
    try:
        validate_request_input([1], child, max_model_len=64, vocab_size=VOCAB, block_size=16, num_usable_blocks=64,
                               has_tokenizer=False)
    except ValueError as e:
        assert "logit_bias has token id 150000" in str(e)
    else:
        raise AssertionError("a token id outside the vocabulary passed")
    child.logit_bias = {-1: 1.0}
    try:
        child.validate()
    except ValueError as e:
        assert "logit_bias keys must be non-negative" in str(e)
    else:
        raise AssertionError("a negative token id passed")


def test_the_tensors_of_the_lists_are_made_on_the_batchs_device():
    meta = torch.device("meta")
    batch = InputBatch(1, 1, 16, meta)
    sp = SamplingParams(logit_bias={3: 1.0}, allowed_token_ids=[3, 4], min_tokens=2, stop_token_ids=[5])
    rows = batch.prepare(SchedulerOutput([ScheduledRequest("r0", [1], 3, [1], True, sp)], 1)).sample_rows
    md = batch.sampling_metadata(rows, 50, [2])
    assert {t.device for t in (*md.logit_bias, *md.allowed, *md.banned)} == {meta}


def test_n_children_share_one_set_of_stop_ids():
    base = SamplingParams(stop_token_ids=list(range(VOCAB)), min_tokens=1)
    candidates = plan_candidates(EngineRequest("req", [1, 2, 3], base), [[1, 2, 3]], [base], 4, None, False)
    stops = [Request(c.request, frozenset({2})).stop_token_ids for c in candidates]
    assert all(s is stops[0] for s in stops) and stops[0] == frozenset(range(VOCAB))
    assert Request(candidates[0].request).stop_token_ids == frozenset(range(VOCAB))  # without EOS ids


def test_the_fields_a_request_sent_are_all_its_dict_holds():
    sp = SamplingParams(logit_bias={3: 1.0}, stop_token_ids=[4])
    sp.child(seed=1).stop_set(frozenset({2}))
    assert sp.as_dict() == {f.name: getattr(sp, f.name) for f in dataclasses.fields(sp) if f.init}


def test_the_prompts_of_a_request_share_one_checked_copy_of_its_lists():
    bias = {str(t): 1 for t in range(VOCAB)}
    req = parse_request(CompletionRequest, {"prompt": [[1, 2], [3, 4, 5], [6]], "logit_bias": bias,
                                            "allowed_token_ids": list(range(VOCAB)), "min_tokens": 1,
                                            "max_tokens": None})
    params = params_per_prompt(req, req.prompts(), max_model_len=10, default_max_tokens=None)
    assert [sp.max_tokens for sp in params] == [8, 7, 9]  # each prompt's room in the context
    assert all(sp.logit_bias is params[0].logit_bias and sp.allowed_token_ids is params[0].allowed_token_ids
               for sp in params)


def test_a_prompt_too_long_for_min_tokens_is_named_like_the_first():
    req = parse_request(CompletionRequest,
                        {"prompt": [[1], [1, 2, 3, 4, 5, 6, 7]], "min_tokens": 5, "max_tokens": None})
    with pytest.raises(ProtocolError) as e:
        params_per_prompt(req, req.prompts(), max_model_len=10, default_max_tokens=None)
    assert e.value.param == "min_tokens"
