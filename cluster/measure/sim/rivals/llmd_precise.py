"""``llmd_precise``: llm-d's inference scheduler with its precise prefix-cache scorer (KV events), at its defaults.

Read from llm-d/llm-d-inference-scheduler ``pkg/plugins/scorer/precise_prefix_cache.go`` (commit 17abea8a) and
``pkg/plugins/scorer/utils.go`` (commit 2202f3ca), with the kv-cache indexer's tier weights (GPU 1.0, CPU 0.8:
its documented defaults, not read in its source here): per server, the longest run of the prompt's leading blocks it
holds in the index its engines' KV events feed, each block weighted by its tier (a device block 1.0, a host-tier block
past the device prefix 0.8). The raw scores are
then min-max normalised over the servers that match at all (``indexedScoresToNormalizedScoredPods``: the best 1,
the worst matching one 0, all matching ones 1 when equal, a server matching nothing 0). That is where this
differs from a share of the request's blocks, as a summary of it may say: the source normalises across servers.

Total (its precise-prefix guide's profile: prefix 2, queue 1, KV cache 1): 2 x that prefix score + 1 x queue score
+ 1 x KV-cache score (the queue and KV scorers of ``llmd``, on scraped ``num_waiting`` and ``kv_usage``, every 50 ms
in ``kvmesh sim``); the highest wins, ties at random.

The index here is the router's (``tiers``), fed by the replicas' events; llm-d's speculative entries are off by
default, so the router's own short-lived predictions (``router.predict_ttl_s``) are the one thing it sees that
llm-d would not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvmesh.cluster.measure.sim.rivals.llmd import (
    SCRAPE_INTERVAL_S,
    kv_cache_scores,
    pick_highest,
    queue_scores,
)
from kvmesh.cluster.measure.sim.rivals.worker_keyed import Loads, Rival
from kvmesh.router.replicas.replica import ReplicaId
from kvmesh.router.routing.policies.base import PolicyConfig
from kvmesh.router.routing.policies.no_replica import check_candidates
from kvmesh.router.routing.tier_matches import TierMatches


@dataclass(frozen=True, slots=True)
class LlmdPreciseConfig(PolicyConfig):
    """The knobs of ``llmd_precise``."""

    prefix_weight: float = 2.0
    """Weight of the precise prefix score."""
    queue_weight: float = 1.0
    """Weight of the queue score."""
    kv_cache_weight: float = 1.0
    """Weight of the KV-cache utilization score."""
    device_block_weight: float = 1.0
    """A matched block in a GPU pool."""
    host_block_weight: float = 0.8
    """A matched block in a host-memory tier."""

    def __post_init__(self) -> None:
        checked = (("prefix_weight", self.prefix_weight),
                   ("queue_weight", self.queue_weight),
                   ("kv_cache_weight", self.kv_cache_weight),
                   ("device_block_weight", self.device_block_weight),
                   ("host_block_weight", self.host_block_weight))
        for name, value in checked:
            if not value >= 0:
                raise ValueError(f"{name} must be >= 0, got {value}")


def precise_prefix_scores(tiers: TierMatches, loads: Loads, device_weight: float,
                          host_weight: float) -> dict[ReplicaId, float]:
    """Tier-weighted longest prefix per candidate, min-max normalised over the candidates that match."""
    raw = {}
    for rid in loads:
        device = tiers.device.get(rid, 0)
        host_beyond = max(0, tiers.host.get(rid, 0) - device)
        if device or host_beyond:
            raw[rid] = device_weight * device + host_weight * host_beyond
    if not raw:
        return dict.fromkeys(loads, 0.0)
    low, high = min(raw.values()), max(raw.values())
    return {rid: (0.0 if rid not in raw else 1.0 if high == low else (raw[rid] - low) / (high - low))
            for rid in loads}


class LlmdPrecisePolicy(Rival):
    scrape_interval_s = SCRAPE_INTERVAL_S
    name = "llmd_precise"
    config_type = LlmdPreciseConfig
    config: LlmdPreciseConfig

    def scores(self, tiers: TierMatches, loads: Loads) -> dict[ReplicaId, float]:
        """Every candidate's weighted total (the highest is chosen)."""
        c = self.config
        prefix = precise_prefix_scores(tiers, loads, c.device_block_weight, c.host_block_weight)
        queue, kv = queue_scores(loads), kv_cache_scores(loads)
        return {rid: c.prefix_weight * prefix[rid] + c.queue_weight * queue[rid] + c.kv_cache_weight * kv[rid]
                for rid in loads}

    def choose_worker(self, request_keys: Sequence[int], tiers: TierMatches, loads: Loads,
                      num_prompt_tokens: int | None = None, lora_name: str | None = None) -> ReplicaId:
        check_candidates(loads)
        return pick_highest(self.scores(tiers, loads), self.rng)
