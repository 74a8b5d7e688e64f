"""Several routing policies over one trace: one simulated run each (``loop.run_policy``), one report
with the infinite-cache and single-pool ceilings beside them."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, fields, replace

from kvmesh.cluster.measure.sim.config import SimConfig, cache_bytes_per_token
from kvmesh.cluster.measure.sim.goodput import label_requests, ttft_slo_summary
from kvmesh.cluster.measure.sim.loop import run_policy
from kvmesh.cluster.measure.sim.lora import lora_summary, with_adapters
from kvmesh.cluster.measure.sim.replica import requests_from_mooncake
from kvmesh.cluster.measure.sim.report import infinite_hit_rate, single_pool_hits, summarize
from kvmesh.cluster.measure.sim.sim_run import SimRun
from kvmesh.cluster.measure.workloads.block_tokens import BlockTokenCache
from kvmesh.cluster.measure.workloads.tenants import assign_tenants, parse_tenant_mix
from kvmesh.cluster.measure.workloads.traces import MooncakeRecord

__all__ = ["SimRun", "blocks_per_replica", "compare_policies", "kv_transfer_variants", "run_policy",
           "working_set_blocks"]


def working_set_blocks(records: list[MooncakeRecord]) -> int:
    """Distinct hash ids of the trace (one block each)."""
    ids: set[int] = set()
    for r in records:
        ids.update(r.hash_ids)
    return len(ids)


def blocks_per_replica(config: SimConfig, records: list[MooncakeRecord]) -> int:
    """Blocks each replica's cache holds: set, or what ``kv_cache_memory_per_replica`` holds at the cache's bytes
    per token, or ``capacity_fraction`` of the trace's working set split evenly."""
    if config.blocks_per_replica is not None:
        return config.blocks_per_replica
    if config.kv_cache_memory_per_replica is not None:
        block_bytes = cache_bytes_per_token(config) * config.engine.block_size
        return max(1, config.kv_cache_memory_per_replica // block_bytes)
    return max(1, math.ceil(config.capacity_fraction * working_set_blocks(records) / config.total_replicas))


def offload_blocks_per_replica(config: SimConfig, records: list[MooncakeRecord]) -> int:
    """Host-tier blocks per replica (0: no tier)."""
    if config.offload_blocks_per_replica is not None:
        return config.offload_blocks_per_replica
    if not config.offload_capacity_fraction:
        return 0
    return max(1, math.ceil(config.offload_capacity_fraction * working_set_blocks(records) / config.total_replicas))


def compare_policies(records: list[MooncakeRecord], config: SimConfig, policies: list[str],
                     show_progress: bool = True, with_ceilings: bool = True,
                     variants: dict[str, dict] | None = None, ttft_slo_s: float | None = None) -> dict:
    """Simulate every policy on ``records``; returns the JSON-ready report.

    ``variants`` runs each policy once per entry, label suffix -> ``SimConfig`` fields to change
    (e.g. ``{" 1 router": {"num_routers": 1}, " 4 routers": {"num_routers": 4}}``); the report
    names each run ``policy + suffix``. Default: one run per policy with ``config`` as given. With ``ttft_slo_s``
    each run reports its ``ttft_slo``: the share of requests whose TTFT met it; it is the routers' TTFT target
    unless ``config.router.admission.ttft_target_s`` names one.
    """
    from tqdm import tqdm

    if ttft_slo_s is not None and config.router.admission.ttft_target_s is None:  # steer to the workload's target
        config = replace(config, router=replace(config.router, admission=replace(config.router.admission,
                                                                                 ttft_target_s=ttft_slo_s)))
    tokens = BlockTokenCache(config.engine.block_size, config.vocab_size, config.seed)
    per_replica = blocks_per_replica(config, records)
    total_blocks = per_replica * config.total_replicas

    classes = assign_tenants(records, mix, config.seed) if (mix := parse_tenant_mix(config.tenants)) else None

    def fresh(time_scale: float = config.time_scale):  # a variant may change the rate
        requests = with_adapters(requests_from_mooncake(records, time_scale, config.engine.block_size), records)
        if classes is not None:
            label_requests(requests, classes)
        return requests

    largest = max(math.ceil((r.num_prompt_tokens + r.max_output_tokens) / config.engine.block_size) for r in fresh())
    if largest > per_replica:
        raise ValueError(f"the largest request needs {largest} blocks but a replica holds {per_replica}: "
                         "raise --blocks-per-replica / --capacity-fraction or use fewer replicas")
    report: dict = {
        "config": _config_dict(config),
        "trace": {"requests": len(records), "working_set_blocks": working_set_blocks(records),
                  "duration_s": (records[-1].arrival_s - records[0].arrival_s) * config.time_scale},
        "blocks_per_replica": per_replica,
        "total_blocks": total_blocks,
        "ceilings": {},
        "policies": {},
    }
    pool_hits = None
    if with_ceilings:
        t0 = time.perf_counter()
        reqs = fresh()
        pool_hits = single_pool_hits(reqs, total_blocks, config.engine.block_size, tokens)
        report["ceilings"] = {
            "infinite_cache_hit_rate": infinite_hit_rate(reqs, config.engine.block_size),
            "single_pool_hit_rate": sum(pool_hits) / max(1, sum(r.num_prompt_tokens for r in reqs)),
            "wall_s": time.perf_counter() - t0,
        }
    host_blocks = offload_blocks_per_replica(config, records)
    report["offload_blocks_per_replica"] = host_blocks
    tiers = {"": {}} if not host_blocks else {"/host-tier": {"offload_blocks_per_replica": host_blocks}}
    if host_blocks and config.offload_compare:
        tiers = {"/no-tier": {"offload_blocks_per_replica": 0}} | tiers
    runs = [(name + suffix + tier, name, _scraping(name, replace(config, **changes, **tier_changes)))
            for name in policies for suffix, changes in (variants or {"": {}}).items()
            for tier, tier_changes in tiers.items()]
    for label, name, cfg in runs:
        with tqdm(total=len(records), desc=f"sim {label}", unit="req", disable=not show_progress,
                  leave=False) as bar:
            run = run_policy(name, fresh(cfg.time_scale), cfg, per_replica, tokens, progress=bar.update)
        summary = summarize(run, pool_hits) | lora_summary(run.requests, [rep.lora for rep in run.replicas])
        if ttft_slo_s is not None:
            summary["ttft_slo"] = ttft_slo_summary(run.requests, ttft_slo_s)
        if cfg.load_poll_s != config.load_poll_s:
            summary["load_poll_s"] = cfg.load_poll_s
        ceiling = report["ceilings"].get("single_pool_hit_rate")
        if ceiling:
            summary["hit_rate_vs_single_pool"] = summary["hit_rate"] / ceiling
        report["policies"][label] = summary
    return report


def _scraping(policy: str, config: SimConfig) -> SimConfig:
    """``config`` for ``policy``: polling every replica's ``/load`` as often as the system it models scrapes its
    metrics (``Policy.scrape_interval_s``), unless a poll is set."""
    from kvmesh.cluster.measure.sim.rivals import COMPARED
    from kvmesh.router.routing.policies import policy_class

    every = policy_class(policy, COMPARED).scrape_interval_s
    return replace(config, load_poll_s=every) if every and not config.load_poll_s else config


def kv_transfer_variants(config: SimConfig) -> dict[str, dict]:
    """The four ways ``--pd-compare`` runs each policy, at the same total of replicas: every replica ``both``
    (baseline), with peer pulls, split into ``num_prefill_replicas`` (1 when 0) prefill + the rest decode, and
    split with peer pulls. Label suffix -> ``SimConfig`` changes (``compare_policies``' ``variants``)."""
    total = config.total_replicas
    prefill = config.num_prefill_replicas or 1
    if total - prefill < 1:
        raise ValueError(f"--pd-compare needs a decode replica beside {prefill} prefill replica(s): "
                         f"{total} replica(s) in all; raise --num-replicas")
    both = {"num_replicas": total, "num_prefill_replicas": 0}
    split = {"num_replicas": total - prefill, "num_prefill_replicas": prefill}
    tag = f"/pd {prefill}p{total - prefill}d"
    return {"/both": both | {"peer_pulls": False}, "/both+pulls": both | {"peer_pulls": True},
            tag: split | {"peer_pulls": False}, tag + "+pulls": split | {"peer_pulls": True}}


def _config_dict(config: SimConfig) -> dict:
    """The run's settings as the report names them: the engine and router fields the simulation reads, flat."""
    d = {f.name: getattr(config, f.name) for f in fields(config) if f.name not in ("engine", "router", "cost", "lora")}
    e, r = config.engine, config.router
    return d | {"block_size": e.block_size, "max_num_batched_tokens": e.max_num_batched_tokens,
                "max_num_seqs": e.max_num_seqs, "predict_ttl_s": r.predict_ttl_s, "session_ttl_s": r.sessions.ttl_s,
                "cost": asdict(config.cost), "lora": asdict(config.lora),
                "router_turn_s": config.turn_s}  # the turns taken: the router's own unless set
