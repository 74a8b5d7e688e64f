"""What the rivals share: each keeps its router's own state in that router's shape, its workers by id, so a rival
chooses a worker's id among the candidates' loads by id (``choose_worker``) and ``Rival.choose`` hands the router
the candidate of that id, as kvmesh's policies answer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvmesh.router.replicas.load import ReplicaLoad
from kvmesh.router.replicas.replica import Replica, ReplicaId
from kvmesh.router.routing.candidates import Candidates
from kvmesh.router.routing.policies.base import Policy
from kvmesh.router.routing.policies.no_replica import check_candidates
from kvmesh.router.routing.tier_matches import TierMatches

Loads = Mapping[ReplicaId, ReplicaLoad]
"""The candidates' loads by worker id, as the rivals' routers know their workers."""


class Rival(Policy):
    """A rival's formula: it chooses a worker by id (``choose_worker``), as its router does."""

    def choose(self, request_keys: Sequence[int], tiers: TierMatches, candidates: Candidates,
               num_prompt_tokens: int | None = None, lora_name: str | None = None) -> Replica:
        check_candidates(candidates)
        chosen = candidates.named(self.choose_worker(request_keys, tiers, candidates.loads, num_prompt_tokens,
                                                     lora_name))
        if chosen is None:
            raise ValueError(f"rival {self.name!r} chose a worker that is not a candidate")
        return chosen

    def choose_worker(self, request_keys: Sequence[int], tiers: TierMatches, loads: Loads,
                      num_prompt_tokens: int | None = None, lora_name: str | None = None) -> ReplicaId:
        """The chosen worker's id among ``loads`` (its router's own answer)."""
        raise NotImplementedError
