"""``llmd``: llm-d's inference scheduler, default profile, at its shipped defaults, with only what it knows.

Scorers read from llm-d/llm-d-inference-scheduler and the gateway-api-inference-extension it builds on (searched
source; the excerpts carried no commit, so no version is pinned here): the approximate prefix scorer's defaults
(``DefaultBlockSizeTokens`` 16, ``DefaultMaxPrefixBlocks`` 256, ``DefaultLRUCapacityPerServer`` 31,250 blocks),
the queue scorer and the KV-cache utilization scorer (min-max normalised waiting count; ``1 - KV usage``), and
its default ``EndpointPickerConfig`` profile: queue-scorer 2, kv-cache-utilization-scorer 2, prefix-cache-scorer
3. The highest total wins, ties at random (its max-score picker shuffles the tied).

- prefix score: the leading blocks of the prompt (at most 256 x 16 tokens) that this scheduler itself sent to the
  server, over the prompt's blocks (at most that many): its own routing history, an LRU of 31,250 x 16 tokens per
  server, no KV events;
- queue score: ``(max - waiting) / (max - min)`` over the candidates' scraped waiting counts, 1 for all when equal
  (``ReplicaLoad.num_waiting``: what the router last polled; ``kvmesh sim`` polls every 50 ms for it, its
  metrics refresh interval, unless ``--load-poll-s`` says otherwise);
- KV-cache score: ``1 - kv_usage`` as scraped (``ReplicaLoad.kv_usage``, idem).

The prefix tree's blocks here are the router's keys at the engine's block size (a key chains its whole prefix, as
its hashes do); its token limits are converted to those blocks.
"""

from __future__ import annotations

import math
import random
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kvmesh.cluster.measure.sim.rivals.worker_keyed import Loads, Rival
from kvmesh.router.replicas.replica import ReplicaId
from kvmesh.router.routing.policies.base import PolicyConfig
from kvmesh.router.routing.policies.no_replica import check_candidates
from kvmesh.router.routing.tier_matches import TierMatches

SCRAPE_INTERVAL_S = 0.05
"""How often the scheduler refreshes every server's metrics (``--refresh-metrics-interval``, 50 ms)."""


@dataclass(frozen=True, slots=True)
class LlmdConfig(PolicyConfig):
    """The knobs of ``llmd`` (its default profile)."""

    prefix_weight: float = 3.0
    """Weight of the approximate prefix score."""
    queue_weight: float = 2.0
    """Weight of the queue score."""
    kv_cache_weight: float = 2.0
    """Weight of the KV-cache utilization score."""
    max_prefix_tokens: int = 256 * 16
    """Leading prompt tokens the prefix score looks at (256 blocks of 16)."""
    lru_capacity_tokens: int = 31_250 * 16
    """Prompt tokens of its routing history kept per server (31,250 blocks of 16)."""

    def __post_init__(self) -> None:
        checked = (("prefix_weight", self.prefix_weight),
                   ("queue_weight", self.queue_weight),
                   ("kv_cache_weight", self.kv_cache_weight))
        for name, value in checked:
            if not value >= 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if self.max_prefix_tokens <= 0 or self.lru_capacity_tokens <= 0:
            raise ValueError("max_prefix_tokens and lru_capacity_tokens must be positive")


def queue_scores(loads: Loads) -> dict[ReplicaId, float]:
    """llm-d's queue scorer: the scraped waiting counts, min-max normalised so the shortest queue scores 1."""
    waiting = {rid: load.num_waiting for rid, load in loads.items()}
    low, high = min(waiting.values()), max(waiting.values())
    if high == low:
        return dict.fromkeys(waiting, 1.0)
    return {rid: (high - w) / (high - low) for rid, w in waiting.items()}


def kv_cache_scores(loads: Loads) -> dict[ReplicaId, float]:
    """llm-d's KV-cache utilization scorer: the free share of each server's KV cache, as scraped."""
    return {rid: 1.0 - load.kv_usage for rid, load in loads.items()}


def pick_highest(total: Mapping[ReplicaId, float], rng: random.Random) -> ReplicaId:
    """The highest-scored replica, ties at random."""
    best = max(total.values())
    return rng.choice([rid for rid, score in total.items() if score == best])


class ServerPrefixes:
    """One server's LRU of the prompt blocks this scheduler sent there (keys only)."""

    __slots__ = ("held", "capacity")

    def __init__(self, capacity_blocks: int) -> None:
        self.held: OrderedDict[int, None] = OrderedDict()
        self.capacity = capacity_blocks

    def match(self, keys: Sequence[int]) -> int:
        """Leading ``keys`` the server was sent."""
        held = self.held
        if not held:
            return 0
        n = 0
        for key in keys:
            if key not in held:
                break
            n += 1
        return n

    def add(self, keys: Sequence[int]) -> None:
        held = self.held
        for key in keys:
            held[key] = None
            held.move_to_end(key)
        while len(held) > self.capacity:
            held.popitem(last=False)


class RoutedPrefixes:
    """llm-d's approximate prefix index of its own routing, keyed as that scheduler keys it: by server."""

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity = capacity_blocks
        self.servers: dict[ReplicaId, ServerPrefixes] = {}

    def server(self, replica_id: ReplicaId) -> ServerPrefixes:
        """``replica_id``'s LRU (made empty on first use)."""
        found = self.servers.get(replica_id)
        if found is None:
            found = self.servers[replica_id] = ServerPrefixes(self.capacity)
        return found


class LlmdPolicy(Rival):
    scrape_interval_s = SCRAPE_INTERVAL_S
    name = "llmd"
    config_type = LlmdConfig
    config: LlmdConfig

    def __init__(self, config: LlmdConfig | None = None, block_size: int = 16, seed: int | None = None) -> None:
        super().__init__(config, block_size, seed)
        self.max_blocks = max(1, self.config.max_prefix_tokens // block_size)
        self.history = RoutedPrefixes(max(1, math.ceil(self.config.lru_capacity_tokens / block_size)))
        """Its own routing history."""

    def scores(self, request_keys: Sequence[int], loads: Loads) -> dict[ReplicaId, float]:
        """Every candidate's weighted total (the highest is chosen)."""
        c = self.config
        keys = request_keys[:self.max_blocks]
        queue, kv = queue_scores(loads), kv_cache_scores(loads)
        total, server = {}, self.history.server
        for rid in loads:
            prefix = server(rid).match(keys) / len(keys) if keys else 0.0
            total[rid] = c.prefix_weight * prefix + c.queue_weight * queue[rid] + c.kv_cache_weight * kv[rid]
        return total

    def choose_worker(self, request_keys: Sequence[int], tiers: TierMatches, loads: Loads,
                      num_prompt_tokens: int | None = None, lora_name: str | None = None) -> ReplicaId:
        check_candidates(loads)
        chosen = pick_highest(self.scores(request_keys, loads), self.rng)
        self.history.server(chosen).add(request_keys[:self.max_blocks])
        return chosen
