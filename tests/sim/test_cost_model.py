"""The cost model: linear step times, validated constants, faithful miniatures."""

from __future__ import annotations

import pytest
from kvmesh.cluster.measure.sim.config import CostModel, SimConfig, miniature


def test_prefill_time_grows_with_uncached_tokens_only():
    cost = CostModel()
    assert cost.step_time(2000, 0, 0) - cost.step_time(1000, 0, 0) == pytest.approx(1000 * cost.prefill_s_per_token)
    assert cost.step_time(0, 0, 0) == cost.step_overhead_s


def test_decode_step_grows_with_batch_and_context():
    cost = CostModel()
    one = cost.step_time(0, 1, 1000)
    assert cost.step_time(0, 2, 1000) - one == pytest.approx(cost.decode_s_per_seq)
    assert cost.step_time(0, 1, 2000) - one == pytest.approx(1000 * cost.decode_s_per_context_token)


def test_negative_constants_are_rejected_by_name():
    with pytest.raises(ValueError, match="prefill_s_per_token"):
        CostModel(prefill_s_per_token=-1.0)


def test_config_validates_at_the_edge():
    with pytest.raises(ValueError, match="time_scale"):
        SimConfig(time_scale=0)
    with pytest.raises(ValueError, match="num_replicas"):
        SimConfig(num_replicas=0)


def test_miniature_keeps_model_time():
    full = SimConfig()
    mini = miniature(full, 8)
    assert (mini.engine.block_size, mini.engine.max_num_batched_tokens) == (64, 1024)
    assert mini.router.block_size == 64  # the router hashes the engine's blocks
    # the same work in 8x fewer tokens takes the same time
    assert mini.cost.step_time(1000, 3, 2000) == pytest.approx(
        full.cost.step_time(8000, 3, 16000) - 0, rel=1e-9)
    with pytest.raises(ValueError, match="must divide"):
        miniature(full, 3)
