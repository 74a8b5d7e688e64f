"""``random``: a uniformly random candidate replica (a baseline)."""

from __future__ import annotations

from collections.abc import Sequence

from kvmesh.router.routing.policies.base import Loads, Policy, ReplicaId
from kvmesh.router.routing.policies.no_replica import check_candidates
from kvmesh.router.routing.tier_matches import TierMatches


class RandomPolicy(Policy):
    name = "random"

    def choose(self, request_keys: Sequence[int], tiers: TierMatches, loads: Loads,
               num_prompt_tokens: int | None = None, lora_name: str | None = None) -> ReplicaId:
        check_candidates(loads)
        ids = list(loads)
        return ids[self.rng.randrange(len(ids))]
