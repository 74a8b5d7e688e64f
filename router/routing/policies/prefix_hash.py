"""``prefix_hash``: consistent hashing of the prompt's leading blocks onto the replicas (a baseline).

Requests whose first ``prefix_blocks`` blocks agree go to the same replica, and adding or removing
a replica moves only the prompts that hashed to it (a hash ring with virtual nodes).
"""

from __future__ import annotations

from bisect import bisect_right

import xxhash
from kvmesh.router.routing.policies.base import Policy


class PrefixHashPolicy(Policy):
    name = "prefix_hash"

    def __init__(self, prefix_blocks: int = 4, virtual_nodes: int = 64, **kwargs) -> None:
        super().__init__(**kwargs)
        if prefix_blocks <= 0 or virtual_nodes <= 0:
            raise ValueError(f"prefix_blocks and virtual_nodes must be positive, got "
                             f"{prefix_blocks} and {virtual_nodes}")
        self.prefix_blocks = prefix_blocks
        """How many leading blocks decide the replica."""
        self.virtual_nodes = virtual_nodes
        """Points per replica on the ring (more = more even spread)."""
        self._ring_ids: frozenset = frozenset()
        self._ring_points: list[int] = []
        self._ring_owners: list = []

    def _build(self, ids: frozenset) -> None:
        points = sorted(
            (xxhash.xxh3_64_intdigest(f"{rid}#{v}".encode()), rid)
            for rid in ids for v in range(self.virtual_nodes)
        )
        self._ring_points = [p for p, _ in points]
        self._ring_owners = [rid for _, rid in points]
        self._ring_ids = ids

    def choose(self, request_keys, matches, loads, num_prompt_tokens=None):
        self._check(loads)
        ids = frozenset(loads)
        if ids != self._ring_ids:
            self._build(ids)
        if not request_keys:  # shorter than a block: no prefix to keep together
            return self._ring_owners[self.rng.randrange(len(self._ring_owners))]
        # Router keys are chained, so the last leading key already covers all the ones before it.
        point = request_keys[min(self.prefix_blocks, len(request_keys)) - 1]
        i = bisect_right(self._ring_points, point) % len(self._ring_points)
        return self._ring_owners[i]
