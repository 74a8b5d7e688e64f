"""``random``: a uniformly random candidate replica (a baseline)."""

from __future__ import annotations

from collections.abc import Sequence

from kvmesh.router.routing.policies.base import Loads, Matches, Policy, ReplicaId


class RandomPolicy(Policy):
    name = "random"

    def choose(self, request_keys: Sequence[int], matches: Matches, loads: Loads,
               num_prompt_tokens: int | None = None) -> ReplicaId:
        self._check(loads)
        ids = list(loads)
        return ids[self.rng.randrange(len(ids))]
