"""``least_loaded``: the replica with the least queued prefill plus weighted decode load (a baseline)."""

from __future__ import annotations

from kvmesh.router.routing.policies.base import Policy


class LeastLoadedPolicy(Policy):
    name = "least_loaded"

    def __init__(self, decode_weight: float = 8.0, **kwargs) -> None:
        super().__init__(**kwargs)
        if decode_weight < 0:
            raise ValueError(f"decode_weight must be >= 0, got {decode_weight}")
        self.decode_weight = decode_weight
        """Prefill tokens one running request is worth."""

    def choose(self, request_keys, matches, loads, num_prompt_tokens=None):
        self._check(loads)
        w = self.decode_weight
        return min(loads, key=lambda r: loads[r].prefill_backlog + w * loads[r].decode_load)
