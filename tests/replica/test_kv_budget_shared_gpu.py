"""Replicas sharing one GPU (replicas.gpus_per_replica < 1): each sizes its KV cache from its own
gpu_memory_utilization share; what the others held when it started is theirs, not counted against it,
and replicas on one card start one after another so that reading is right."""

from __future__ import annotations

import threading
import time

import pytest
from kvmesh.replica.actor import gpu_load_lock
from kvmesh.replica.worker.kv_cache import DeviceMemory, kv_cache_budget

GIB = 2**30


def test_the_second_replica_on_a_card_gets_its_own_share():
    # 80 GiB card; replica A (0.45) already holds 36 GiB. B loads 4 GiB weights + 1 GiB peak, its context 0.5 GiB.
    a_holds, b_weights, b_peak, b_context = 36 * GIB, 4 * GIB, GIB, GIB // 2
    before = DeviceMemory(total=80 * GIB, free=80 * GIB - a_holds - b_weights - b_context, torch_peak=b_weights,
                          torch_reserved=b_weights, torch_allocated=b_weights)
    after = DeviceMemory(total=80 * GIB, free=before.free - b_peak, torch_peak=b_weights + b_peak,
                         torch_reserved=b_weights + b_peak, torch_allocated=b_weights)
    assert after.non_torch == a_holds + b_context
    budget = kv_cache_budget(before, after, b_weights, 0.45, outside_at_start=a_holds)
    assert budget == int(36 * GIB - b_weights - b_peak - b_context)


def test_without_the_start_reading_the_other_replica_would_leave_no_room():
    mem = DeviceMemory(total=80 * GIB, free=80 * GIB - 36 * GIB - 5 * GIB, torch_peak=5 * GIB,
                       torch_reserved=5 * GIB, torch_allocated=5 * GIB)
    with pytest.raises(ValueError, match="leaves no room"):
        kv_cache_budget(mem, mem, 5 * GIB, 0.45)


def test_a_share_larger_than_what_was_free_at_start_is_a_clear_error():
    mem = DeviceMemory(total=80 * GIB, free=30 * GIB, torch_peak=5 * GIB, torch_reserved=5 * GIB,
                       torch_allocated=5 * GIB)
    with pytest.raises(ValueError, match=r"asks for 40.0 of the device's 80.0 GiB, but 45.0 GiB were in use"):
        kv_cache_budget(mem, mem, 5 * GIB, 0.5, outside_at_start=45 * GIB)


def _load_twice(tmp_path, first_ids, second_ids, together: bool = False) -> list[tuple[str, float]]:
    """Two replicas 'load' at the same moment, each holding the lock 0.3 s (``together``: until both hold theirs,
    which only happens if the locks let them); the times each entered and left."""
    events: list[tuple[str, float]] = []
    start, inside = threading.Barrier(2), threading.Barrier(2, timeout=10)

    def load(name, ids):
        start.wait()
        with gpu_load_lock(ids, str(tmp_path)):
            events.append((f"{name} in", time.monotonic()))
            inside.wait() if together else time.sleep(0.3)  # the load under test, holding the lock
            events.append((f"{name} out", time.monotonic()))

    threads = [threading.Thread(target=load, args=("a", first_ids)),
               threading.Thread(target=load, args=("b", second_ids))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return sorted(events, key=lambda e: e[1])


def test_replicas_sharing_a_card_load_one_after_another(tmp_path):
    order = [name.split()[1] for name, _ in _load_twice(tmp_path, ["0"], ["0"])]
    assert order == ["in", "out", "in", "out"]


def test_replicas_on_different_cards_load_together(tmp_path):
    order = [name.split()[1] for name, _ in _load_twice(tmp_path, ["0"], ["1"], together=True)]
    assert order == ["in", "in", "out", "out"]
