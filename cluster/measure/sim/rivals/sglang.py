"""``sglang``: sglang-router's and vllm-router's ``cache_aware`` policy, at their CLI defaults, with what they know.

Read from sgl-project/sglang ``sgl-router/src/policies/cache_aware.rs`` (commit b6f20641,
``CacheAwarePolicy::select_worker``); vllm-project/router's ``cache_aware`` is the same policy. CLI defaults:
``cache_threshold`` 0.3, ``balance_abs_threshold`` 64, ``balance_rel_threshold`` 1.5.

- The load of a worker is the router's own count of its in-flight requests. When the load is imbalanced
  (``max - min > balance_abs_threshold`` and ``max > balance_rel_threshold * min``) the least-loaded worker gets
  the request (shortest queue), and the request is still inserted into its tree.
- Otherwise the approximate tree -- the request texts this router sent to each worker; no KV events -- gives the
  longest prefix match and a worker holding it. Match rate = matched / request length. Above ``cache_threshold``
  the request goes there; else to the worker whose tree is smallest (most cache room). The request is inserted
  for the chosen worker.

Here the tree holds the router's block keys (a key chains its whole prefix), not characters, so lengths are in
blocks; of the workers holding the deepest matched block the one routed there most recently is taken, and ties
of the smallest tree are broken at random. Each worker's tree keeps ``max_tree_size`` characters (as tokens at
4 characters each), the least recently routed evicted as soon as it is over (sglang evicts every 120 s).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from kvmesh.cluster.measure.sim.rivals.worker_keyed import Loads, Rival
from kvmesh.router.replicas.replica import ReplicaId
from kvmesh.router.routing.policies.base import PolicyConfig
from kvmesh.router.routing.policies.no_replica import check_candidates
from kvmesh.router.routing.tier_matches import TierMatches


@dataclass(frozen=True, slots=True)
class SglangConfig(PolicyConfig):
    """The knobs of ``sglang`` (its CLI names and defaults)."""

    cache_threshold: float = 0.3
    """Least match rate that routes to the worker holding the match."""
    balance_abs_threshold: int = 64
    """In-flight requests between the busiest and idlest worker beyond which the load is imbalanced ..."""
    balance_rel_threshold: float = 1.5
    """... if also the busiest has more than this times the idlest's."""
    max_tree_size_tokens: int = 2**26 // 4
    """Prompt tokens kept per worker's tree, the least recently routed evicted first (``max_tree_size``, 2**26
    characters, at 4 characters a token)."""

    def __post_init__(self) -> None:
        if not 0 <= self.cache_threshold <= 1:
            raise ValueError(f"cache_threshold must be in [0, 1], got {self.cache_threshold}")
        if self.balance_abs_threshold < 0 or not self.balance_rel_threshold >= 0:
            raise ValueError("balance_abs_threshold and balance_rel_threshold must be >= 0")
        if self.max_tree_size_tokens <= 0:
            raise ValueError(f"max_tree_size_tokens must be positive, got {self.max_tree_size_tokens}")


class ApproximateTree:
    """The request prefixes routed to each worker: key -> {worker: when last routed there}; per worker its keys in
    the order last routed, the least recent evicted past ``capacity`` keys."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.nodes: dict[int, dict[ReplicaId, int]] = {}
        self.lru: dict[ReplicaId, OrderedDict[int, None]] = {}
        self.clock = 0

    def size(self, worker: ReplicaId) -> int:
        held = self.lru.get(worker)
        return len(held) if held else 0

    def prefix_match(self, keys: Sequence[int]) -> tuple[int, ReplicaId | None]:
        """Leading ``keys`` some worker was sent, and the worker of the deepest one last sent it."""
        n, holders = 0, None
        for key in keys:
            found = self.nodes.get(key)
            if found is None:
                break
            n, holders = n + 1, found
        if holders is None:
            return 0, None
        return n, max(holders, key=holders.__getitem__)

    def insert(self, keys: Sequence[int], worker: ReplicaId) -> None:
        self.clock += 1
        held = self.lru.setdefault(worker, OrderedDict())
        for key in keys:
            self.nodes.setdefault(key, {})[worker] = self.clock
            held[key] = None
            held.move_to_end(key)
        while len(held) > self.capacity:
            key, _ = held.popitem(last=False)
            holders = self.nodes[key]
            del holders[worker]
            if not holders:
                del self.nodes[key]


class SglangPolicy(Rival):
    name = "sglang"
    config_type = SglangConfig
    config: SglangConfig

    def __init__(self, config: SglangConfig | None = None, block_size: int = 16, seed: int | None = None) -> None:
        super().__init__(config, block_size, seed)
        self.tree = ApproximateTree(max(1, math.ceil(self.config.max_tree_size_tokens / block_size)))
        """Its approximate tree."""

    def imbalanced(self, loads: Loads) -> bool:
        c = self.config
        counts = [load.in_flight + load.peer_in_flight for load in loads.values()]
        high, low = max(counts), min(counts)
        return high - low > c.balance_abs_threshold and high > low * c.balance_rel_threshold

    def pick(self, request_keys: Sequence[int], loads: Loads) -> ReplicaId:
        """The worker ``choose`` returns, before the tree learns of the request."""
        if self.imbalanced(loads):
            return min(loads, key=lambda r: loads[r].in_flight + loads[r].peer_in_flight)
        matched, holder = self.tree.prefix_match(request_keys)
        rate = matched / len(request_keys) if request_keys else 0.0
        if rate > self.config.cache_threshold and holder in loads:
            return holder
        sizes = {rid: self.tree.size(rid) for rid in loads}
        smallest = min(sizes.values())
        return self.rng.choice([rid for rid, size in sizes.items() if size == smallest])

    def choose_worker(self, request_keys: Sequence[int], tiers: TierMatches, loads: Loads,
                      num_prompt_tokens: int | None = None, lora_name: str | None = None) -> ReplicaId:
        check_candidates(loads)
        chosen = self.pick(request_keys, loads)
        self.tree.insert(request_keys, chosen)
        return chosen
