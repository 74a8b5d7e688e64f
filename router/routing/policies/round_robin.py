"""``round_robin``: cycle over the candidate replicas, ignoring cache and load (a baseline)."""

from __future__ import annotations

from collections.abc import Sequence

from kvmesh.router.routing.policies.base import Loads, Policy, PolicyConfig, ReplicaId
from kvmesh.router.routing.policies.no_replica import check_candidates
from kvmesh.router.routing.tier_matches import TierMatches


class RoundRobinPolicy(Policy):
    name = "round_robin"

    def __init__(self, config: PolicyConfig | None = None, block_size: int = 16, seed: int | None = None) -> None:
        super().__init__(config, block_size, seed)
        self._next = 0

    def choose(self, request_keys: Sequence[int], tiers: TierMatches, loads: Loads,
               num_prompt_tokens: int | None = None, lora_name: str | None = None) -> ReplicaId:
        check_candidates(loads)
        ids = list(loads)
        replica_id = ids[self._next % len(ids)]
        self._next += 1
        return replica_id
