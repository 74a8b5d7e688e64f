"""The simulator run on placements made elsewhere: every request goes to the replica a live run sent it to, so what
is left between the live run and the simulator is the replicas' timing, not the router's choices
(``kvmesh bench emulated_fleet``'s middle column). Fresh replicas are alike, so a live replica is the simulator's
replica of its rank in order of first use."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from kvmesh.router.replicas.replica import Replica
from kvmesh.router.routing.candidates import Candidates
from kvmesh.router.routing.policies.base import Policy
from kvmesh.router.routing.tier_matches import TierMatches


def placements(order: Sequence[str], replica_of: Mapping[str, str], sim_ids: Sequence[str]) -> list[str]:
    """The simulator's replica id for each request of ``order`` (request ids in arrival order), from the live
    replica each was sent to (``replica_of``); ValueError when the live run used more replicas than ``sim_ids``."""
    rank: dict[str, int] = {}
    for request_id in order:
        rank.setdefault(replica_of[request_id], len(rank))
    if len(rank) > len(sim_ids):
        raise ValueError(f"the live run used {len(rank)} replicas, the simulator has {len(sim_ids)}")
    return [sim_ids[rank[replica_of[request_id]]] for request_id in order]


class PlacementReplay(Policy):
    """Sends the n-th request routed to the n-th replica of ``chosen`` (the simulator routes in arrival order)."""

    name = "placement_replay"

    def __init__(self, chosen: Sequence[str], block_size: int = 16) -> None:
        super().__init__(None, block_size)
        self._next: Iterator[str] = iter(chosen)

    def choose(self, request_keys: Sequence[int], tiers: TierMatches, candidates: Candidates,
               num_prompt_tokens: int | None = None, lora_name: str | None = None) -> Replica:
        want = next(self._next, None)
        for replica in candidates:
            if replica.id == want:
                return replica
        raise ValueError(f"the replayed placement names replica {want!r}, not a candidate")
