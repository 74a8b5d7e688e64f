"""The runner's kept token-list tensors (token_lists.py) against the lists themselves: over seeded random sequences
of batch events (rows joining with and without each kind of list, leaving, moving in the step's order, preempted
and resumed, passing min_tokens, n children sharing lists, empty lists, a request id joining again), every step's
(banned, logit_bias, allowed) tensors hold exactly what a plain walk of the rows' params gives, and the sampled
tokens are those of metadata built from scratch."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from kvmesh.replica.sample.sampler import Sampler, build_sampling_metadata
from kvmesh.replica.sample.token_lists import BatchTokenLists
from kvmesh.replica.serving.sampling_params import SamplingParams
from kvmesh.replica.step.scheduler_output import ScheduledRequest, SchedulerOutput
from kvmesh.replica.worker.input_batch import InputBatch

VOCAB, ROWS, EOS = 40, 8, (2, 3)
SEQUENCES, EVENTS = 300, 40


def random_params(rng: random.Random, live: list[SamplingParams]) -> SamplingParams:
    if live and rng.random() < 0.25:  # an n child: the same lists, another seed
        return rng.choice(live).child(seed=rng.randrange(1000))
    ids = lambda: rng.sample(range(VOCAB), rng.randint(0, 5))  # noqa: E731
    min_tokens = rng.choice([0, 0, 1, 2, 4])
    allowed = rng.choice([None, None, ids() or None])
    return SamplingParams(temperature=rng.choice([0.0, 0.8]), seed=rng.randrange(1000), max_tokens=8,
                          min_tokens=min_tokens, ignore_eos=rng.random() < 0.3, stop_token_ids=ids(),
                          logit_bias=rng.choice([None, {}, {t: rng.uniform(-5, 5) for t in ids()}]),
                          allowed_token_ids=allowed)


def expected(params: list[SamplingParams], num_generated: list[int]) -> tuple[set, set, set, set]:
    """(banned (row, id), bias (row, id, value), allowing rows, allowed (row, id)) from the params themselves."""
    banned, bias, allowing, allowed = set(), set(), set(), set()
    for row, (sp, n) in enumerate(zip(params, num_generated, strict=True)):
        if n < sp.min_tokens:
            banned |= {(row, t) for t in [*sp.stop_token_ids, *(() if sp.ignore_eos else EOS)]}
        bias |= {(row, t, round(float(np.float32(b)), 5)) for t, b in (sp.logit_bias or {}).items()}
        if sp.allowed_token_ids:
            allowing.add(row)
            allowed |= {(row, t) for t in sp.allowed_token_ids}
    return banned, bias, allowing, allowed


def held(step: tuple) -> tuple[set, set, set, set]:
    banned, bias, allowed = step
    pairs = lambda rows, ids: set(zip(rows.tolist(), ids.tolist(), strict=True))  # noqa: E731
    return (set() if banned is None else pairs(*banned),
            set() if bias is None else {(r, t, round(b, 5)) for r, t, b in zip(*(x.tolist() for x in bias),
                                                                               strict=True)},
            set() if allowed is None else set(allowed[0].tolist()),
            set() if allowed is None else pairs(*allowed[1:]))


def shapes(step: tuple) -> list:
    return [None if kind is None else [tuple(t.shape) for t in kind] for kind in step]


def batch_event(rng: random.Random, rows: dict[int, SamplingParams], gone: list[SamplingParams], freed: list[int],
                num_generated: np.ndarray, batches: tuple[BatchTokenLists, ...]) -> None:
    """One join, leave or resend of a random row (or nothing)."""
    event = rng.random()
    free = [r for r in range(ROWS) if r not in rows]
    if free and event < 0.45:
        sp = gone.pop() if gone and rng.random() < 0.3 else random_params(rng, list(rows.values()))
        row = freed.pop() if freed and rng.random() < 0.7 else rng.choice(free)
        rows[row], num_generated[row] = sp, rng.choice([0, num_generated[row]])
        for lists in batches:
            lists.set_row(row, sp)
    elif rows and event < 0.75:
        row = rng.choice(list(rows))
        gone.append(rows.pop(row))
        freed.append(row)
        for lists in batches:
            lists.clear_row(row)
    elif rows and event < 0.85:  # sent in full again on its row (a resumed request, a later prefill chunk)
        row = rng.choice(list(rows))
        for lists in batches:
            lists.set_row(row, rows[row])
    if set(freed) & set(rows):
        freed[:] = [r for r in freed if r not in rows]


def run_sequence(seed: int) -> None:
    rng = random.Random(seed)
    kept, on_meta = BatchTokenLists(torch.device("cpu")), BatchTokenLists(torch.device("meta"))
    kept.fit(ROWS)
    on_meta.fit(ROWS)
    rows: dict[int, SamplingParams] = {}  # row -> its request's params
    gone: list[SamplingParams] = []  # requests that left, which may come back (preempted, or the same id again)
    num_generated = np.zeros(ROWS, np.int64)
    step_rows = np.zeros(0, np.int64)
    freed: list[int] = []  # rows in the order they were freed: a joining request takes the last (as the batch)
    for _ in range(EVENTS):
        for _ in range(rng.randint(1, 3)):  # a few joins and leaves between two steps
            batch_event(rng, rows, gone, freed, num_generated, (kept, on_meta))
        if not rows:
            continue
        if not (len(step_rows) and set(step_rows.tolist()) <= set(rows) and rng.random() < 0.4):  # else as before
            step_rows = np.array(rng.sample(list(rows), rng.randint(1, len(rows))), np.int64)  # any order
        num_generated[step_rows] += np.array([rng.choice([0, 1, 1, 2]) for _ in step_rows])
        params = [rows[r] for r in step_rows.tolist()]
        gen = num_generated[step_rows]
        step = kept.step(step_rows, gen, EOS)
        assert held(step) == expected(params, gen.tolist()), (seed, step_rows)
        assert shapes(on_meta.step(step_rows, gen, EOS)) == shapes(step)
        logits = torch.from_numpy(np.random.default_rng(seed).standard_normal((len(params), VOCAB), np.float32))
        cached = build_sampling_metadata(params, gen.tolist(), VOCAB, EOS, torch.device("cpu"), lists=step)
        fresh = build_sampling_metadata(params, gen.tolist(), VOCAB, EOS, torch.device("cpu"))
        assert Sampler()(logits, cached).tolist() == Sampler()(logits, fresh).tolist()


@pytest.mark.parametrize("chunk", range(6))
def test_kept_token_list_tensors_hold_what_the_rows_params_say(chunk):
    for seed in range(chunk, SEQUENCES, 6):
        run_sequence(seed)


def test_the_batchs_rows_through_prepare_free_and_readmission():
    """The same through InputBatch: requests decoding by id (moved by their context length), freed, and joining
    again under the same id, their metadata against the expected lists."""
    rng = random.Random(7)
    batch = InputBatch(ROWS, 4, 16, torch.device("cpu"))
    live: dict[str, SamplingParams] = {}
    for step in range(200):
        finished = [rid for rid in live if rng.random() < 0.15  # or past its 3 blocks
                    or batch.num_computed[batch.block_tables.rows[rid]] >= 47]
        joining = [f"r{rng.randrange(12)}" for _ in range(rng.randint(0, 2))]
        joining = [rid for rid in dict.fromkeys(joining) if rid not in live or rid in finished]
        joining = joining[:ROWS - len(live) + len(finished)]
        for rid in finished:
            del live[rid]
        srs = [ScheduledRequest(rid, [1], rng.randint(1, 30), [1, 2, 3], True, random_params(rng, list(live.values())))
               for rid in joining]
        decoding = list(live)
        live.update({sr.request_id: sr.sampling_params for sr in srs})
        if not live:
            batch.free(finished)
            continue
        out = SchedulerOutput(srs, len(live), decode_request_ids=decoding, finished_request_ids=set(finished))
        batch.free(out.finished_request_ids)
        rows = batch.prepare(out).sample_rows
        gen = batch.num_output[rows]
        params = [batch.params[r] for r in rows.tolist()]
        assert [live[batch.req_ids[r]] for r in rows.tolist()] == params
        md = batch.sampling_metadata(rows, VOCAB, EOS)
        assert held((md.banned, md.logit_bias, md.allowed)) == expected(params, gen.tolist()), step
        batch.count_samples(rows, torch.zeros(len(rows), dtype=torch.long))
