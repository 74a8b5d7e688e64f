"""``round_robin``: cycle over the candidate replicas, ignoring cache and load (a baseline)."""

from __future__ import annotations

from collections.abc import Sequence

from kvmesh.router.replicas.replica import Replica
from kvmesh.router.routing.candidates import Candidates
from kvmesh.router.routing.policies.base import Policy, PolicyConfig
from kvmesh.router.routing.policies.no_replica import check_candidates
from kvmesh.router.routing.tier_matches import TierMatches


class RoundRobinPolicy(Policy):
    name = "round_robin"

    def __init__(self, config: PolicyConfig | None = None, block_size: int = 16, seed: int | None = None) -> None:
        super().__init__(config, block_size, seed)
        self._next = 0

    def choose(self, request_keys: Sequence[int], tiers: TierMatches, candidates: Candidates,
               num_prompt_tokens: int | None = None, lora_name: str | None = None) -> Replica:
        check_candidates(candidates)
        chosen = candidates[self._next % len(candidates)]
        self._next += 1
        return chosen
