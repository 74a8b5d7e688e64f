"""``random``: a uniformly random candidate replica (a baseline)."""

from __future__ import annotations

from kvmesh.router.routing.policies.base import Policy


class RandomPolicy(Policy):
    name = "random"

    def choose(self, request_keys, matches, loads, num_prompt_tokens=None):
        self._check(loads)
        ids = list(loads)
        return ids[self.rng.randrange(len(ids))]
