"""What the router's ``/metrics`` reads of its state at each scrape (router/http/metrics.py's ``_StateCollector``):
the index, each replica's health, load and degraded causes, the event and load feeds, the sync stream, the default
policy's queue tail."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvmesh.router.routing.policies.cache_aware_tokens_cost import TokensCost

if TYPE_CHECKING:
    from kvmesh.router.control.event_feed import EventFeed
    from kvmesh.router.control.router_sync import RouterSync
    from kvmesh.router.routing.kv_router import KVRouter

__all__ = ["metrics_state"]


def metrics_state(r: KVRouter, feed: EventFeed, feed_state: dict, sync: RouterSync | None) -> dict:
    """The state of router ``r`` as the metrics collector reads it (the index under the router's lock), with its
    event and load feeds (``feed``, and ``feed_state`` as ``/health`` reads it) and its sync stream."""
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
    sub = feed.subscriber.stats if feed.subscriber is not None else {}
    out["subscriber"] = {name: st.as_dict() for name, st in sub.items()}
    out["event_lag"] = {rep.id: rep.stream.lag_s for rep in r.replicas if rep.stream.lag_s is not None}
    out["feed"] = feed_state
    out["load_feed"] = feed.loads.counters() if feed.loads is not None else {}
    out["sync"] = sync.counters() if sync is not None else None
    tail = r.policy.tail if isinstance(r.policy, TokensCost) else None  # cache_aware_tokens' tail_knee, where on
    out["queue_tail"] = None if tail is None else {"tail": tail.tail, "lift": tail.lift}
    return out
