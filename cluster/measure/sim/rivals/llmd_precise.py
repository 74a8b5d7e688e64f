"""``llmd_precise``: llm-d's router with its precise prefix-cache producer (KV events), at its defaults.

Read from llm-d/llm-d-router at commit ebab6879 (August 2026): ``deploy/config/epp-precise-prefix-cache-config.yaml``
(the precise producer feeding the generic prefix-cache scorer; prefix 2, KV cache 1, queue 1),
``dataproducer/preciseprefixcache/producer.go``, ``scorer/prefix/plugin.go`` and ``pkg/kvcache/kvblock_scorer.go``.
Per server, the longest run of the prompt's leading blocks it holds in the index its engines' KV events feed, each
block weighted by the best tier it is held in (a device block 1.0, a host-tier block 0.8:
``DefaultKVCacheBackendConfig``); the producer truncates that weighted length to whole blocks and the scorer divides it
by the request's blocks (``matchBlocks / totalBlocks``; its ``matchLengthWeight`` is 0 by default, so the match's
absolute length does not count). A server matching nothing scores 0.

Total: 2 x that prefix score + 1 x queue score + 1 x KV-cache score (the queue and KV scorers of ``llmd``, on scraped
``num_waiting`` and ``kv_usage``, every 50 ms in ``kvmesh sim``); the highest wins, ties at random.

llm-d's releases before May 2026 normalised the raw lengths min-max over the servers that matched (the best 1, the
worst matching 0), so a server holding one block of a prompt nobody else held scored as one holding all of it; the
share of the request is less sticky, and it is what ships now.

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


def precise_prefix_scores(tiers: TierMatches, loads: Loads, num_blocks: int, device_weight: float,
                          host_weight: float) -> dict[ReplicaId, float]:
    """Each candidate's tier-weighted longest prefix, truncated to whole blocks, over the request's ``num_blocks``."""
    if num_blocks <= 0:
        return dict.fromkeys(loads, 0.0)
    out = {}
    for rid in loads:
        device = tiers.device.get(rid, 0)
        host_beyond = max(0, tiers.host.get(rid, 0) - device)
        out[rid] = int(device_weight * device + host_weight * host_beyond) / num_blocks
    return out


class LlmdPrecisePolicy(Rival):
    scrape_interval_s = SCRAPE_INTERVAL_S
    name = "llmd_precise"
    config_type = LlmdPreciseConfig
    config: LlmdPreciseConfig

    def scores(self, num_blocks: int, tiers: TierMatches, loads: Loads) -> dict[ReplicaId, float]:
        """Every candidate's weighted total for a request of ``num_blocks`` (the highest is chosen)."""
        c = self.config
        prefix = precise_prefix_scores(tiers, loads, num_blocks, c.device_block_weight, c.host_block_weight)
        queue, kv = queue_scores(loads), kv_cache_scores(loads)
        return {rid: c.prefix_weight * prefix[rid] + c.queue_weight * queue[rid] + c.kv_cache_weight * kv[rid]
                for rid in loads}

    def choose_worker(self, request_keys: Sequence[int], tiers: TierMatches, loads: Loads,
                      num_prompt_tokens: int | None = None, lora_name: str | None = None) -> ReplicaId:
        check_candidates(loads)
        return pick_highest(self.scores(len(request_keys), tiers, loads), self.rng)
