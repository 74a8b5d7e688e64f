"""Input preparation: positions, slots and logits rows from a SchedulerOutput; incremental block tables."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from kvmesh.replica.serving.sampling_params import SamplingParams
from kvmesh.replica.step.scheduler_output import ScheduledRequest, SchedulerOutput
from kvmesh.replica.worker.block_table import BlockTables
from kvmesh.replica.worker.input_batch import InputBatch, prepare_inputs

CPU = torch.device("cpu")
SP = SamplingParams(temperature=0.0)


def test_decodes_go_first_and_positions_slots_follow_the_block_tables():
    reqs = [ScheduledRequest("p", [10, 11, 12], 2, [7, 3], True, SP),  # positions 2..4 in blocks 7, 3
            ScheduledRequest("d", [20], 5, [9, 4], True, SP),          # position 5 -> block 4, offset 1
            ScheduledRequest("c", [30, 31], 0, [5], False, SP)]        # a chunk that does not sample
    inputs = prepare_inputs(reqs, 4, CPU)
    assert inputs.input_ids.tolist() == [20, 10, 11, 12, 30, 31]
    assert inputs.positions.tolist() == [5, 2, 3, 4, 0, 1]
    assert inputs.common.slot_mapping.tolist() == [4 * 4 + 1, 7 * 4 + 2, 7 * 4 + 3, 3 * 4 + 0, 5 * 4, 5 * 4 + 1]
    assert inputs.common.num_decodes == 1
    assert inputs.common.query_start_loc_cpu == [0, 1, 4, 6] and inputs.common.seq_lens_cpu == [6, 5, 2]
    assert inputs.common.block_tables.tolist() == [[9, 4], [7, 3], [5, 0]]
    assert inputs.logits_indices.tolist() == [0, 3]
    assert inputs.sample_request_ids == ["d", "p"]


def test_decode_rows_are_ordered_longest_context_first():
    reqs = [ScheduledRequest(f"d{n}", [1], n, [1, 2, 3, 4], True, SP) for n in (3, 9, 0, 12)]
    inputs = prepare_inputs(reqs, 4, CPU)
    assert inputs.common.seq_lens_cpu == [13, 10, 4, 1]
    assert inputs.sample_request_ids == ["d12", "d9", "d3", "d0"]


def test_incremental_block_tables_match_tables_built_from_scratch():
    rng = random.Random(0)
    cache = BlockTables(num_rows=2, num_cols=2)  # both grow
    live = {f"r{i}": [rng.randrange(1, 500) for _ in range(rng.randrange(1, 4))] for i in range(6)}
    for _ in range(30):
        rid = rng.choice(sorted(live))
        action = rng.random()
        if action < 0.5:
            live[rid].extend(rng.randrange(1, 500) for _ in range(rng.randrange(0, 3)))  # extended in place
        elif action < 0.7:
            live[rid] = [rng.randrange(1, 500) for _ in range(rng.randrange(1, 6))]  # re-admitted: a new list
        elif action < 0.8:
            cache.free([rid])
            live[f"n{rng.random()}"] = live.pop(rid)[:]
        reqs = [ScheduledRequest(r, [1], 0, ids, True, SP) for r, ids in live.items()]
        width = max(len(ids) for ids in live.values())
        expected = np.array([ids + [0] * (width - len(ids)) for ids in live.values()], np.int32)
        np.testing.assert_array_equal(cache.gather(reqs, width), expected)


def test_a_decode_by_id_continues_from_the_rows_own_sample():
    batch = InputBatch(4, 4, 4, CPU)
    first = batch.prepare(SchedulerOutput([ScheduledRequest("a", [10, 11, 12], 0, [7], True, SP)], 3))
    assert first.sample_request_ids == ["a"]
    batch.record_samples(first.sample_rows, torch.tensor([42]))
    nxt = batch.prepare(SchedulerOutput([], 1, decode_request_ids=["a"], new_block_ids={}))
    assert nxt.input_ids.tolist() == [42] and nxt.positions.tolist() == [3]
    assert nxt.common.slot_mapping.tolist() == [7 * 4 + 3]
    batch.record_samples(nxt.sample_rows, torch.tensor([43]))
    crossing = batch.prepare(SchedulerOutput([], 1, decode_request_ids=["a"], new_block_ids={"a": [9]}))
    assert crossing.input_ids.tolist() == [43] and crossing.common.slot_mapping.tolist() == [9 * 4 + 0]


def test_a_decode_by_id_for_an_unknown_request_is_a_clear_error():
    batch = InputBatch(4, 4, 4, CPU)
    with pytest.raises(RuntimeError, match="holds no row for it"):
        batch.prepare(SchedulerOutput([], 1, decode_request_ids=["ghost"]))
