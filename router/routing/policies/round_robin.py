"""``round_robin``: cycle over the candidate replicas, ignoring cache and load (a baseline)."""

from __future__ import annotations

from kvmesh.router.routing.policies.base import Policy


class RoundRobinPolicy(Policy):
    name = "round_robin"

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._next = 0

    def choose(self, request_keys, matches, loads, num_prompt_tokens=None):
        self._check(loads)
        ids = list(loads)
        replica_id = ids[self._next % len(ids)]
        self._next += 1
        return replica_id
