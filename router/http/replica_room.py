"""A router replica record as admission reads it (router/admission/room.py): its room, and whether it is idle."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvmesh.router.admission.room import LearnedSlots, ReplicaRoom

if TYPE_CHECKING:
    from kvmesh.router.replicas.replica import Replica


def room_of(replica: Replica) -> ReplicaRoom:
    """What ``replica``'s room is judged from: its learned slots (kept on its record), in flight, reported counts."""
    if replica.learned_slots is None:
        replica.learned_slots = LearnedSlots()
    load = replica.load
    return ReplicaRoom(replica.learned_slots, load.total_in_flight, load.num_running, load.num_waiting,
                       load.max_num_seqs)


def is_idle(replica: Replica | None) -> bool:
    """Whether the replica (None: removed) has nothing in flight from this host and reports nothing waiting."""
    return replica is not None and replica.load.total_in_flight == 0 and replica.load.num_waiting == 0
