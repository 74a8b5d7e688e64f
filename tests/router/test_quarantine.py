"""A replica degraded for bad frames holds nothing in the router's index until it starts afresh
: its matches are ignored while degraded anyway, and a hostile stream must not make the
router keep (or grow) a tree for it."""

import time

from kvmesh.events.schema import AllBlocksCleared, KVEventBatch
from kvmesh.events.subscribe.health import DEGRADED, RECOVERED
from kvmesh.router.config import RouterConfig
from kvmesh.router.control.runtime import RouterRuntime

from .helpers import stored

BS = 4
PROMPT = list(range(1, 33))  # 8 full blocks


def runtime_with(*replicas: str) -> RouterRuntime:
    runtime = RouterRuntime(RouterConfig(block_size=BS))
    for rid in replicas:
        runtime.router.add_replica(rid)
    return runtime


def batch(*events) -> KVEventBatch:
    return KVEventBatch(ts=time.time(), events=list(events))


def test_a_degraded_replica_is_dropped_from_the_index_and_its_batches_ignored():
    rt = runtime_with("bad", "good")
    rt.feed.on_batch("bad", 0, batch(stored(PROMPT, BS)))
    rt.feed.on_batch("good", 0, batch(stored(PROMPT[:16], BS)))
    rt.feed.on_status("bad", DEGRADED, "20 bad frames within 10s")
    assert rt.router.index.num_blocks("bad") == 0
    assert "bad" in rt.router.degraded
    rt.feed.on_batch("bad", 1, batch(stored(PROMPT, BS)))
    assert rt.router.index.num_blocks("bad") == 0 and rt.replicas.get("bad").stream.dropped_batches == 1
    assert rt.router.index.num_blocks("good") == 4  # the other replica is untouched


def test_a_snapshot_resync_ends_the_quarantine_and_is_applied():
    rt = runtime_with("bad")
    rt.feed.on_status("bad", DEGRADED, "garbage")
    rt.feed.on_batch("bad", 7, batch(AllBlocksCleared(), stored(PROMPT, BS)))  # the snapshot asked for
    assert rt.router.index.num_blocks("bad") == 8
    rt.feed.on_batch("bad", 8, batch(stored(PROMPT + [40, 41, 42, 43], BS, start_block=8, num_blocks=1)))
    assert rt.router.index.num_blocks("bad") == 9
    assert "bad" in rt.router.degraded  # still routed by load until its probation ends


def test_a_source_without_snapshots_relearns_from_an_empty_tree_once_trusted_again():
    rt = runtime_with("plain")
    rt.feed.on_batch("plain", 0, batch(stored(PROMPT, BS)))
    rt.feed.on_status("plain", DEGRADED, "garbage")
    rt.feed.on_status("plain", RECOVERED, "no bad frame for a whole window")
    assert "plain" not in rt.router.degraded
    assert rt.router.index.num_blocks("plain") == 0
    rt.feed.on_batch("plain", 5, batch(stored(PROMPT[:8], BS)))
    assert rt.router.index.num_blocks("plain") == 2
