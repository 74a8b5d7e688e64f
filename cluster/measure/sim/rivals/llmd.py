"""``llmd``: llm-d's router (its endpoint picker), default profile, at its shipped defaults, with only what it knows.

Read from llm-d/llm-d-router at commit ebab6879 (August 2026), where the inference scheduler now lives: the default
``EndpointPickerConfig`` (``pkg/epp/config/loader/defaults.go``: queue-scorer 2, kv-cache-utilization-scorer 2,
prefix-cache-scorer 3), the prefix-cache scorer over the approximate prefix producer's match
(``dataproducer/approximateprefix``), the queue scorer and the KV-cache utilization scorer. The highest total wins,
ties at random (its max-score picker shuffles the tied).

- prefix score: the request's blocks the scheduler itself sent to a server, over the request's blocks. Its blocks are
  ``max(engine block size, 64)`` tokens (``AutoTune``, on by default, reads the engine's ``block_size`` from its
  metrics; ``minBlockSizeTokens`` floors it at 64), the last one partial, at most 131,072 tokens
  (``defaultMaxPrefixTokens``). Walking the request's blocks from the first until a block no server was sent, each
  server counts the blocks it was sent (``matchLongestPrefix``). Its own routing history, no KV events: an LRU per
  server of as many blocks as the server's KV cache reports (``AutoTune``: ``CacheNumBlocks``, read when the server
  is first routed to; 31,250 without the metric), which holds 64-token blocks where the engine counts its own;
- queue score: ``(max - waiting) / (max - min)`` over the candidates' scraped waiting counts, 1 for all when equal
  (``ReplicaLoad.num_waiting``: what the router last polled; ``kvmesh sim`` polls every 50 ms for it, its
  metrics refresh interval, unless ``--load-poll-s`` says otherwise);
- KV-cache score: ``1 - kv_usage`` as scraped (``ReplicaLoad.kv_usage``, idem).

Its blocks here are the router's keys at the engine's block size, every ``64 / block_size``-th one (a key chains its
whole prefix, as its hashes do; an engine block size that does not divide 64 makes its blocks the next multiple).
The partial last block is keyed by the last whole engine block's key and the prompt's length: two prompts alike up to
their last engine block and as long are taken as one there, which a real tokenised tail tells apart. A prompt shorter
than one engine block has no key to tell it by and no block here (llm-d would hash its one partial block).
"""

from __future__ import annotations

import math
import random
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

from kvmesh.cluster.measure.sim.rivals.worker_keyed import Loads, Rival
from kvmesh.router.replicas.replica import ReplicaId
from kvmesh.router.routing.policies.base import PolicyConfig
from kvmesh.router.routing.policies.no_replica import check_candidates
from kvmesh.router.routing.tier_matches import TierMatches

SCRAPE_INTERVAL_S = 0.05
"""How often the scheduler refreshes every server's metrics (``--refresh-metrics-interval``, 50 ms)."""


MIN_BLOCK_SIZE_TOKENS = 64
"""The smallest block it hashes a prompt in, whatever the engine's (``minBlockSizeTokens``)."""


@dataclass(frozen=True, slots=True)
class LlmdConfig(PolicyConfig):
    """The knobs of ``llmd`` (its default profile and its approximate prefix producer's defaults)."""

    prefix_weight: float = 3.0
    """Weight of the approximate prefix score."""
    queue_weight: float = 2.0
    """Weight of the queue score."""
    kv_cache_weight: float = 2.0
    """Weight of the KV-cache utilization score."""
    auto_tune: bool = True
    """Block size from the engine's and each server's LRU from its reported KV blocks (``AutoTune``)."""
    block_size_tokens: int = 16
    """Its block size without ``auto_tune`` (``defaultBlockSizeTokens``), floored at 64 all the same."""
    max_prefix_tokens: int = 131_072
    """Leading prompt tokens the prefix score looks at (``defaultMaxPrefixTokens``)."""
    lru_capacity_blocks: int = 31_250
    """Blocks of a server's LRU without ``auto_tune`` or a reported cache size (``defaultLRUCapacityPerServer``)."""

    def __post_init__(self) -> None:
        checked = (("prefix_weight", self.prefix_weight),
                   ("queue_weight", self.queue_weight),
                   ("kv_cache_weight", self.kv_cache_weight))
        for name, value in checked:
            if not value >= 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if min(self.block_size_tokens, self.max_prefix_tokens, self.lru_capacity_blocks) <= 0:
            raise ValueError("block_size_tokens, max_prefix_tokens and lru_capacity_blocks must be positive")


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


class RoutedPrefixes:
    """llm-d's approximate prefix index of its own routing: an LRU of blocks per server, and who holds each block."""

    def __init__(self) -> None:
        self.servers: dict[ReplicaId, OrderedDict[Hashable, None]] = {}
        self.capacity: dict[ReplicaId, int] = {}
        self.holders: dict[Hashable, set[ReplicaId]] = {}

    def add(self, replica_id: ReplicaId, blocks: Sequence[Hashable], capacity_blocks: int) -> None:
        """``blocks`` sent to ``replica_id``, each made its LRU's newest; its LRU is sized by ``capacity_blocks``
        when first used, and each block past that evicts the least recently sent."""
        held = self.servers.get(replica_id)
        if held is None:
            held = self.servers[replica_id] = OrderedDict()
            self.capacity[replica_id] = capacity_blocks
        capacity, holders = self.capacity[replica_id], self.holders
        for block in blocks:
            held[block] = None
            held.move_to_end(block)
            holders.setdefault(block, set()).add(replica_id)
            if len(held) > capacity:
                old, _ = held.popitem(last=False)
                owners = holders[old]
                owners.discard(replica_id)
                if not owners:
                    del holders[old]

    def matches(self, blocks: Sequence[Hashable]) -> dict[ReplicaId, int]:
        """Per server, the blocks it was sent among the request's leading blocks that some server was sent
        (``matchLongestPrefix``: the walk stops at the first block no server holds)."""
        found: dict[ReplicaId, int] = {}
        for block in blocks:
            owners = self.holders.get(block)
            if not owners:
                break
            for rid in owners:
                found[rid] = found.get(rid, 0) + 1
        return found


class LlmdPolicy(Rival):
    scrape_interval_s = SCRAPE_INTERVAL_S
    name = "llmd"
    config_type = LlmdConfig
    config: LlmdConfig

    def __init__(self, config: LlmdConfig | None = None, block_size: int = 16, seed: int | None = None) -> None:
        super().__init__(config, block_size, seed)
        c = self.config
        wanted = max(block_size if c.auto_tune else c.block_size_tokens, MIN_BLOCK_SIZE_TOKENS)
        self.stride = math.ceil(wanted / block_size)
        """Engine blocks per block of its own."""
        self.block_size_tokens = self.stride * block_size
        self.max_blocks = max(1, c.max_prefix_tokens // self.block_size_tokens)
        self.history = RoutedPrefixes()
        """Its own routing history."""

    def blocks(self, request_keys: Sequence[int], num_prompt_tokens: int | None) -> list[Hashable]:
        """The request's blocks as it hashes them: whole ones from every ``stride``-th engine key, then the partial
        last one, at most ``max_blocks``."""
        out: list[Hashable] = list(request_keys[self.stride - 1::self.stride])
        whole = len(out) * self.block_size_tokens
        if request_keys and num_prompt_tokens is not None and num_prompt_tokens > whole:
            out.append(("tail", request_keys[-1], num_prompt_tokens))
        return out[:self.max_blocks]

    def scores(self, blocks: Sequence[Hashable], loads: Loads) -> dict[ReplicaId, float]:
        """Every candidate's weighted total for a request of ``blocks`` (the highest is chosen)."""
        c = self.config
        queue, kv = queue_scores(loads), kv_cache_scores(loads)
        matched = self.history.matches(blocks)
        return {rid: c.prefix_weight * (matched.get(rid, 0) / len(blocks) if blocks else 0.0)
                + c.queue_weight * queue[rid] + c.kv_cache_weight * kv[rid] for rid in loads}

    def choose_worker(self, request_keys: Sequence[int], tiers: TierMatches, loads: Loads,
                      num_prompt_tokens: int | None = None, lora_name: str | None = None) -> ReplicaId:
        check_candidates(loads)
        blocks = self.blocks(request_keys, num_prompt_tokens)
        chosen = pick_highest(self.scores(blocks, loads), self.rng)
        reported = loads[chosen].num_kv_blocks
        capacity = reported if self.config.auto_tune and reported > 0 else self.config.lru_capacity_blocks
        self.history.add(chosen, blocks, capacity)
        return chosen
