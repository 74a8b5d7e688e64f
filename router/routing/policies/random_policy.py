"""``random``: a uniformly random candidate replica (a baseline)."""

from __future__ import annotations

from collections.abc import Sequence

from kvmesh.router.replicas.replica import Replica
from kvmesh.router.routing.candidates import Candidates
from kvmesh.router.routing.policies.base import Policy
from kvmesh.router.routing.policies.no_replica import check_candidates
from kvmesh.router.routing.tier_matches import TierMatches


class RandomPolicy(Policy):
    name = "random"

    def choose(self, request_keys: Sequence[int], tiers: TierMatches, candidates: Candidates,
               num_prompt_tokens: int | None = None, lora_name: str | None = None) -> Replica:
        check_candidates(candidates)
        return candidates[self.rng.randrange(len(candidates))]
