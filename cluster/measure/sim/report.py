"""What a simulation run reports: per-policy summary, gap attribution, ceilings, table and JSON.

Per-policy summary of a simulation run: hit rate, TTFT, queueing, load balance, events/s, and what KV
transfers did (transfer_report.py). The hit rate is the share of prompt tokens no replica computed: a split
request's prefill leg counts its computed tokens, and tokens a transfer brought count as cached.

Where a policy's hit tokens went, against the single pool: every lost token gets one cause.

For each request, with ``pool`` = tokens the single pool found cached, ``best`` = the best hit any
candidate replica offered when the router decided, ``predicted`` = the chosen replica's hit in
the router's view, ``actual`` = what the chosen replica found on admission (the receipt)::

    pool - actual = (pool - best)           not held by any replica when routed (evictions of the
                                            partitioned pools; negative where a replica kept a
                                            prefix the single pool had evicted)
                  + (best - predicted)      given away by the policy (load or session diversions)
                  + (predicted - actual)    changed between routing and admission (evicted while
                                            queued; negative: stored meanwhile, e.g. by a
                                            request of the same prefix routed just before)

Each term is summed over requests and reported as points of hit rate (fraction of all prompt
tokens); the positive and negative parts of the first and last terms are kept apart.

Hit-rate ceilings a router is measured against, on the same trace and block accounting.

- *infinite*: one cache that never evicts: every full block seen before is a hit.
- *single pool*: one real ``KVCacheManager`` with the cluster's total capacity, requests served
  one after another in arrival order (no in-flight pinning): what a perfect router would get if
  the cluster's memory were one LRU pool.

Accounting matches the engine: only full blocks are cached, a request reuses its longest cached
prefix, and at least one prompt token is always computed (a fully cached, block-aligned prompt
recomputes its last block), so hits are capped at ``num_prompt_tokens - 1`` rounded to blocks.

The simulator's printed table and JSON file.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from kvmesh.cluster.measure.sim.goodput import format_goodput_table, goodput_summary, has_targets
from kvmesh.cluster.measure.sim.replica import SimRequest
from kvmesh.cluster.measure.sim.stats import imbalance, percentiles
from kvmesh.cluster.measure.sim.transfer_report import format_transfer_table, transfer_summary
from kvmesh.cluster.measure.workloads.block_tokens import BlockTokenCache
from kvmesh.kvcache.reuse import reusable_tokens

if TYPE_CHECKING:
    from kvmesh.cluster.measure.sim.sim_run import SimRun
    from kvmesh.router.routing.index import PrefixIndex


def summarize(run: SimRun, pool_hits: list[int] | None = None) -> dict:
    """The run's numbers; with the single pool's per-request hits, the attribution of the gap. Requests the
    router's admission shed are left out of every number but the goodput's (goodput.py)."""
    offered = run.requests
    if any(r.shed_reason is not None for r in offered):
        if pool_hits is not None:
            pool_hits = [h for h, r in zip(pool_hits, offered, strict=True) if r.shed_reason is None]
        run = dataclasses.replace(run, requests=[r for r in offered if r.shed_reason is None])
    reqs = run.requests
    prompt = sum(r.num_prompt_tokens for r in reqs)
    cached = sum(r.num_cached_tokens for r in reqs)
    computed = sum(r.computed_prompt_tokens for r in reqs)  # by the serving replica and any prefill leg
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
        "hit_rate": 1 - computed / prompt if prompt else 0.0,
        "host_hit_rate": sum(r.num_host_cached_tokens for r in reqs) / prompt if prompt else 0.0,
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
        "live_ceiling": router.receipts.ceiling.summary(),
    }
    out["transfers"] = transfer_summary(run)
    if has_targets(offered):
        out["goodput"] = goodput_summary(offered)
    if pool_hits is not None:
        out["gap_to_single_pool"] = attribute_gap(reqs, pool_hits)
    return out


def _index_stats(index: PrefixIndex) -> dict:
    stats = index.stats
    values = {f.name: getattr(stats, f.name) for f in dataclasses.fields(stats)}
    return {k: v for k, v in values.items() if isinstance(v, int | float)}


def attribute_gap(requests: Sequence[SimRequest], pool_hits: Sequence[int]) -> dict:
    """The decomposition above for one run (``pool_hits[i]`` belongs to ``requests[i]``)."""
    if len(pool_hits) != len(requests):
        raise ValueError(f"{len(pool_hits)} single-pool hits for {len(requests)} requests")
    prompt = sum(r.num_prompt_tokens for r in requests) or 1
    evicted = kept = diverted = race_lost = race_gained = 0
    for r, pool in zip(requests, pool_hits, strict=True):
        best, predicted = r.receipt.best_hit_tokens, r.predicted_hit_tokens
        held = pool - best
        if held > 0:
            evicted += held
        else:
            kept -= held
        diverted += best - predicted
        race = predicted - r.own_cached_tokens
        if race > 0:
            race_lost += race
        else:
            race_gained -= race
    pool_total = sum(pool_hits)
    actual = sum(r.own_cached_tokens for r in requests)
    return {
        "gap_points": 100 * (pool_total - actual) / prompt,
        "evicted_everywhere_points": 100 * evicted / prompt,
        "kept_beyond_pool_points": 100 * kept / prompt,
        "diverted_points": 100 * diverted / prompt,
        "routing_admission_race_lost_points": 100 * race_lost / prompt,
        "routing_admission_race_gained_points": 100 * race_gained / prompt,
    }


def capped_hit_tokens(num_matched_blocks: int, num_prompt_tokens: int, block_size: int) -> int:
    """Tokens reused by a request whose first ``num_matched_blocks`` blocks are cached."""
    return reusable_tokens(num_matched_blocks, num_prompt_tokens, block_size)


def infinite_hit_rate(requests: list[SimRequest], block_size: int) -> float:
    seen: set[int] = set()  # hash ids are chained: an id names its whole prefix
    hit = total = 0
    for r in requests:
        full = r.hash_ids[: r.num_prompt_tokens // block_size]
        m = 0
        while m < len(full) and full[m] in seen:
            m += 1
        hit += capped_hit_tokens(m, r.num_prompt_tokens, block_size)
        total += r.num_prompt_tokens
        seen.update(full)
    return hit / total if total else 0.0


def single_pool_hit_rate(requests: list[SimRequest], num_blocks: int, block_size: int,
                         tokens: BlockTokenCache, hash_seed: bytes = b"\0" * 32) -> float:
    """Replay through one real KVCacheManager of ``num_blocks`` usable blocks."""
    hits = single_pool_hits(requests, num_blocks, block_size, tokens, hash_seed)
    total = sum(r.num_prompt_tokens for r in requests)
    return sum(hits) / total if total else 0.0


def single_pool_hits(requests: list[SimRequest], num_blocks: int, block_size: int,
                     tokens: BlockTokenCache, hash_seed: bytes = b"\0" * 32) -> list[int]:
    """Cached tokens of each request (in order) in one real KVCacheManager of ``num_blocks`` blocks."""
    from kvmesh.kvcache.kv_cache_manager import KVCacheManager

    kv = KVCacheManager(num_blocks + 1, block_size, hash_seed)
    hits = []
    for r in requests:
        req = SimRequest(r.request_id, r.arrival_s, r.hash_ids, r.num_prompt_tokens, r.max_output_tokens)
        req.all_token_ids = tokens.prompt(r.hash_ids, r.num_prompt_tokens)
        computed, num_cached = kv.get_computed_blocks(req)
        num_new = req.num_prompt_tokens + req.max_output_tokens - num_cached
        if kv.allocate_slots(req, num_new, num_cached, computed) is None:
            raise ValueError(f"{r.request_id} does not fit a single pool of {num_blocks} blocks")
        kv.free(req)
        hits.append(num_cached)
    return hits


def format_table(report: dict) -> str:
    ceil = report.get("ceilings", {})
    lines = [
        f"{report['config']['num_replicas']} replicas x {report['blocks_per_replica']} blocks of "
        f"{report['config']['block_size']} tokens (total {report['total_blocks']}; trace working set "
        f"{report['trace']['working_set_blocks']} blocks), {report['trace']['requests']} requests "
        f"over {report['trace']['duration_s']:.0f} s"
        + (f"; host tier {report['offload_blocks_per_replica']} blocks per replica"
           if report.get("offload_blocks_per_replica") else ""),
    ]
    if ceil:
        lines.append(f"ceilings: infinite cache {ceil['infinite_cache_hit_rate']:.1%}, "
                     f"single pool of the same total capacity {ceil['single_pool_hit_rate']:.1%}")
    width = max([16, *(len(name) + 2 for name in report["policies"])])
    header = (f"{'policy':<{width}}{'hit':>7}{'host':>7}{'/pool':>7}{'capt':>6}{'mispred':>8}"
              f"{'TTFT p50':>10}{'TTFT p99':>10}{'queue p50':>10}"
              f"{'queue p99':>10}{'max/mean':>9}{'events/s':>10}{'blocks/s':>10}{'cpu s':>7}")
    lines += [header, "-" * len(header)]
    for name, s in report["policies"].items():
        rel = s.get("hit_rate_vs_single_pool")
        rc = s.get("receipts", {})
        lines.append(
            f"{name:<{width}}{s['hit_rate']:>7.1%}{s.get('host_hit_rate', 0.0):>7.1%}"
            f"{(f'{rel:.1%}' if rel is not None else '-'):>7}"
            f"{rc.get('captured_ratio', float('nan')):>6.0%}{rc.get('mispredicted_rate', float('nan')):>8.1%}"
            f"{s['ttft_s']['p50']:>10.3f}{s['ttft_s']['p99']:>10.3f}{s['queue_s']['p50']:>10.3f}"
            f"{s['queue_s']['p99']:>10.3f}{s['load_imbalance']:>9.2f}{s['events_per_s']:>10,.0f}"
            f"{s['index_blocks_per_s']:>10,.0f}{s['cpu_s']:>7.1f}")
    gaps = {n: s["gap_to_single_pool"] for n, s in report["policies"].items() if "gap_to_single_pool" in s}
    if gaps:
        lines.append("gap to the single pool, points of hit rate = evicted everywhere - kept beyond the pool "
                     "+ diverted + race lost - race gained:")
        for name, g in gaps.items():
            lines.append(f"  {name:<{width}}{g['gap_points']:6.2f} = {g['evicted_everywhere_points']:.2f} - "
                         f"{g['kept_beyond_pool_points']:.2f} + {g['diverted_points']:.2f} + "
                         f"{g['routing_admission_race_lost_points']:.2f} - "
                         f"{g['routing_admission_race_gained_points']:.2f}")
    if any(s["transfers"]["num_prefill_replicas"] or s["transfers"]["peer_pulls_enabled"]
           for s in report["policies"].values() if "transfers" in s):
        lines.append(format_transfer_table(report))
    if goodput := format_goodput_table(report):
        lines.append(goodput)
    return "\n".join(lines)


def write_json(report: dict, path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(report, indent=2, sort_keys=False) + "\n")
    return p
