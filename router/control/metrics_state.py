"""What the router's ``/metrics`` reads of its state at each scrape (router/http/metrics.py's ``_StateCollector``):
the index, each replica's health, load and degraded causes, the event and load feeds, the sync stream."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvmesh.router.control.runtime import RouterRuntime

__all__ = ["metrics_state"]


def metrics_state(runtime: RouterRuntime) -> dict:
    """The state of ``runtime`` as the metrics collector reads it (the index under the router's lock)."""
    r = runtime.router
    with r.lock:
        index_blocks = {str(rid): r.index.num_blocks(rid) for rid in r.index.replica_ids}
        records = list(r.replicas.records())
        stats = r.index.stats
        out = {
            "index_blocks": index_blocks, "index_keys": r.index.num_keys,
            "events_applied": r.events_applied,
            "index": {"orphan_blocks": stats.orphan_blocks, "unknown_removals": stats.unknown_removals},
            "healthy": {rep.id: rep.healthy for rep in records}, "loads": {rep.id: rep.load for rep in records},
            "degraded": {rep.id: dict(rep.degraded) for rep in records},
        }
    sub = runtime.subscriber.stats if runtime.subscriber is not None else {}
    out["subscriber"] = {name: st.as_dict() for name, st in sub.items()}
    out["event_lag"] = {rep.id: rep.stream.lag_s for rep in runtime.replicas if rep.stream.lag_s is not None}
    out["feed"] = runtime.feed_state()
    out["load_feed"] = runtime.feed.loads.counters() if runtime.feed.loads is not None else {}
    out["sync"] = runtime.sync.counters() if runtime.sync is not None else None
    return out
