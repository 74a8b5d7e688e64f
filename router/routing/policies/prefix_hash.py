"""``prefix_hash``: consistent hashing of the prompt's leading blocks onto the replicas (a baseline).

Requests whose first ``prefix_blocks`` blocks agree go to the same replica, and adding or removing
a replica moves only the prompts that hashed to it (a hash ring with virtual nodes).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

import xxhash
from kvmesh.router.routing.policies.base import Loads, Policy, PolicyConfig, ReplicaId
from kvmesh.router.routing.tier_matches import TierMatches


@dataclass(frozen=True, slots=True)
class PrefixHashConfig(PolicyConfig):
    """The knobs of ``prefix_hash``."""

    prefix_blocks: int = 4
    """How many leading blocks decide the replica."""
    virtual_nodes: int = 64
    """Points per replica on the ring (more = more even spread)."""

    def __post_init__(self) -> None:
        if self.prefix_blocks <= 0 or self.virtual_nodes <= 0:
            raise ValueError(f"prefix_blocks and virtual_nodes must be positive, got "
                             f"{self.prefix_blocks} and {self.virtual_nodes}")


class PrefixHashPolicy(Policy):
    name = "prefix_hash"
    config_type = PrefixHashConfig
    config: PrefixHashConfig

    def __init__(self, config: PrefixHashConfig | None = None, block_size: int = 16,
                 seed: int | None = None) -> None:
        super().__init__(config, block_size, seed)
        self._ring_ids: frozenset[ReplicaId] = frozenset()
        self._ring_points: list[int] = []
        self._ring_owners: list[ReplicaId] = []

    def _build(self, ids: frozenset[ReplicaId]) -> None:
        points = sorted(
            (xxhash.xxh3_64_intdigest(f"{rid}#{v}".encode()), rid)
            for rid in ids for v in range(self.config.virtual_nodes)
        )
        self._ring_points = [p for p, _ in points]
        self._ring_owners = [rid for _, rid in points]
        self._ring_ids = ids

    def choose(self, request_keys: Sequence[int], tiers: TierMatches, loads: Loads,
               num_prompt_tokens: int | None = None, lora_name: str | None = None) -> ReplicaId:
        self._check(loads)
        ids = frozenset(loads)
        if ids != self._ring_ids:
            self._build(ids)
        if not request_keys:  # shorter than a block: no prefix to keep together
            return self._ring_owners[self.rng.randrange(len(self._ring_owners))]
        # Router keys are chained, so the last leading key already covers all the ones before it.
        point = request_keys[min(self.config.prefix_blocks, len(request_keys)) - 1]
        i = bisect_right(self._ring_points, point) % len(self._ring_points)
        return self._ring_owners[i]
