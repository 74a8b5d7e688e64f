"""``prefix_hash``: consistent hashing of the prompt's leading blocks onto the replicas (a baseline).

Requests whose first ``prefix_blocks`` blocks agree go to the same replica, and adding or removing
a replica moves only the prompts that hashed to it (a hash ring with virtual nodes).
"""

from __future__ import annotations

import random
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import xxhash
from kvmesh.router.replicas.replica import Replica
from kvmesh.router.replicas.replica_set import ReplicaSet
from kvmesh.router.routing.candidates import Candidates
from kvmesh.router.routing.policies.base import Policy, PolicyConfig
from kvmesh.router.routing.policies.no_replica import check_candidates
from kvmesh.router.routing.tier_matches import TierMatches


@dataclass(frozen=True, slots=True)
class PrefixHashConfig(PolicyConfig):
    """The knobs of ``prefix_hash``."""

    prefix_blocks: int = 4
    """How many leading blocks decide the replica."""
    virtual_nodes: int = 64
    """Points per replica on the ring (more = more even spread)."""

    def __post_init__(self) -> None:
        if self.prefix_blocks <= 0 or self.virtual_nodes <= 0:
            raise ValueError(f"prefix_blocks and virtual_nodes must be positive, got "
                             f"{self.prefix_blocks} and {self.virtual_nodes}")


class PrefixHashPolicy(Policy):
    """The ring holds every replica of the router's set (rebuilt when a replica joins or leaves); a prompt goes to
    the first candidate clockwise from its point, which is where a ring of the candidates alone would send it. A
    policy used without a router rings the candidates of each call."""

    name = "prefix_hash"
    config_type = PrefixHashConfig
    config: PrefixHashConfig

    def __init__(self, config: PrefixHashConfig | None = None, block_size: int = 16,
                 seed: int | None = None) -> None:
        super().__init__(config, block_size, seed)
        self._replicas: ReplicaSet | None = None
        self._ring_version: int | None = None
        """The set's ``members_version`` the ring was built for."""
        self._ring_points: list[int] = []
        self._ring_owners: list[Replica] = []

    def use_replicas(self, replicas: ReplicaSet) -> None:
        self._replicas, self._ring_version = replicas, None

    def _ring(self, records: Iterable[Replica]) -> tuple[list[int], list[Replica]]:
        """Each replica's virtual nodes, placed by the hash of its id (the same ring in every router)."""
        points = sorted(((xxhash.xxh3_64_intdigest(f"{r.id}#{v}".encode()), r.id, r)
                         for r in records for v in range(self.config.virtual_nodes)), key=lambda p: p[:2])
        return [p for p, _, _ in points], [r for _, _, r in points]

    def _current_ring(self, candidates: Candidates) -> tuple[list[int], list[Replica]]:
        replicas = self._replicas
        if replicas is None:
            return self._ring(candidates)
        if self._ring_version != replicas.members_version:
            self._ring_points, self._ring_owners = self._ring(replicas.records())
            self._ring_version = replicas.members_version
        return self._ring_points, self._ring_owners

    def choose(self, request_keys: Sequence[int], tiers: TierMatches, candidates: Candidates,
               num_prompt_tokens: int | None = None, lora_name: str | None = None) -> Replica:
        check_candidates(candidates)
        points, owners = self._current_ring(candidates)
        blocks = self.config.prefix_blocks
        chosen = _first_candidate(points, owners, request_keys, blocks, candidates, self.rng)
        if chosen is None:  # candidates outside the router's set: a ring of their own
            chosen = _first_candidate(*self._ring(candidates), request_keys, blocks, candidates, self.rng)
        assert chosen is not None  # a ring of the candidates holds them all
        return chosen


def _first_candidate(points: list[int], owners: list[Replica], request_keys: Sequence[int], prefix_blocks: int,
                     candidates: Candidates, rng: random.Random) -> Replica | None:
    """The first owner among ``candidates`` clockwise from the prompt's point (None: no owner is a candidate)."""
    n = len(owners)
    if not n:
        return None
    if request_keys:  # router keys are chained, so the last leading key already covers all the ones before it
        start = bisect_right(points, request_keys[min(prefix_blocks, len(request_keys)) - 1]) % n
    else:  # shorter than a block: no prefix to keep together
        start = rng.randrange(n)
    for i in range(start, start + n):
        owner = owners[i % n]
        if owner in candidates:
            return owner
    return None
