"""Per-policy summary of a simulation run: hit rate, TTFT, queueing, load balance, events/s."""

from __future__ import annotations

import numpy as np
from kvmesh.cluster.sim.attribution import attribute_gap
from kvmesh.cluster.sim.loop import SimRun


def percentiles(values, qs=(50, 90, 99)) -> dict[str, float]:
    if len(values) == 0:
        return {f"p{q}": float("nan") for q in qs} | {"mean": float("nan")}
    arr = np.asarray(values, dtype=float)
    out = {f"p{q}": float(np.percentile(arr, q)) for q in qs}
    out["mean"] = float(arr.mean())
    return out


def imbalance(values) -> float:
    """max / mean (1.0 = perfectly even); 1.0 when nothing ran."""
    arr = np.asarray(values, dtype=float)
    mean = arr.mean() if len(arr) else 0.0
    return float(arr.max() / mean) if mean > 0 else 1.0


def summarize(run: SimRun, pool_hits: list[int] | None = None) -> dict:
    """The run's numbers; with the single pool's per-request hits, the attribution of the gap."""
    reqs = run.requests
    prompt = sum(r.num_prompt_tokens for r in reqs)
    cached = sum(r.num_cached_tokens for r in reqs)
    predicted = sum(r.predicted_hit_tokens for r in reqs)
    ttft = [r.first_token_s - r.arrival_s for r in reqs]
    queue = [r.admitted_s - r.arrival_s for r in reqs]
    e2e = [r.finished_s - r.arrival_s for r in reqs]
    busy = [rep.busy_s for rep in run.replicas]
    makespan = max(r.finished_s for r in reqs) - min(r.arrival_s for r in reqs)
    router = run.router
    stats = _index_stats(router.index)
    receipts = router.receipts.total
    out = {
        "policy": run.policy,
        "num_routers": len(router.routers),
        "num_requests": len(reqs),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "hit_rate": cached / prompt if prompt else 0.0,
        "router_predicted_hit_rate": predicted / prompt if prompt else 0.0,
        "ttft_s": percentiles(ttft),
        "queue_s": percentiles(queue),
        "e2e_s": percentiles(e2e),
        "load_imbalance": imbalance(busy),
        "prefill_tokens_imbalance": imbalance([rep.prefill_tokens for rep in run.replicas]),
        "requests_imbalance": imbalance([rep.num_requests for rep in run.replicas]),
        "replica_busy_s": {"max": float(max(busy)), "mean": float(np.mean(busy))},
        "utilization": float(np.mean(busy)) / makespan if makespan > 0 else 0.0,
        "prefill_tokens": sum(rep.prefill_tokens for rep in run.replicas),
        "makespan_s": makespan,
        "events": router.num_events,
        "events_per_s": router.num_events / router.apply_s if router.apply_s > 0 else 0.0,
        "route_ms_per_request": 1000 * run.route_s / len(reqs) if reqs else 0.0,
        "wall_s": run.wall_s,
        "cpu_s": run.cpu_s,
        "index_stats": stats,
        "index_blocks_per_s": (stats.get("blocks_stored", 0) + stats.get("blocks_removed", 0)) / router.apply_s
        if router.apply_s > 0 else 0.0,
        "receipts": {"captured_ratio": receipts.captured_ratio, "mispredicted_rate": receipts.mispredicted_rate,
                     "available_tokens": receipts.available_tokens, "reasons": dict(receipts.reasons)},
    }
    if pool_hits is not None:
        out["gap_to_single_pool"] = attribute_gap(reqs, pool_hits)
    return out


def _index_stats(index) -> dict:
    stats = getattr(index, "stats", None)
    if stats is None:
        return {}
    fields = getattr(stats, "__dataclass_fields__", None) or getattr(stats, "__slots__", ())
    return {k: getattr(stats, k) for k in fields if isinstance(getattr(stats, k, None), int | float)}
