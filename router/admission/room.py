"""Whether a replica can start a request soon, and how fast a queue drains.

A request goes on from the router's queue when a replica can start it at once and soon, so the replicas' own
queues stay short and the order decided here (priority, fair share) is the order served. "Soon" is the cost
model's predicted wait in seconds when the policy gives one (``RouteDecision.predicted_ttft_s``, within
``admit_ttft_s``); "at once": the requests this host's router processes have in flight there are fewer than it
runs at once -- its *slots*.

A kvmesh replica says its ``max_num_seqs`` in ``/load``; the slots are also learned from its reports (its KV
cache may run fewer): when it reports requests waiting, the ones it runs are all it can, learned again each time
it reports waiting requests and trusted ``slots_ttl_s``. A learned count past its time is probed one above (one
more request: if that one waits, the count is learned again, fresh; if the replica runs it without waiting, the
count rises to what runs and the probing goes on above it). Neither said nor learned, a replica has room as long
as it reports no waiting requests. A replica with nothing in flight from this host always has room (so the queue
always moves). A fresh running count seen without waiting requests never raises the slots: a finishing request is
still counted by the replica while the router already sent the next one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(slots=True)
class LearnedSlots:
    """What admission learned of one replica's slots (module doc), kept by whoever keeps the replica (the router's
    replica record, a simulated replica), so that it goes with it."""

    slots: int | None = None
    """Requests it was seen running at once with others waiting (None: not learned yet)."""
    seen_at: float = math.inf
    """When that was last seen (inf: it never expires)."""


@dataclass(slots=True, frozen=True)
class ReplicaRoom:
    """What room is judged from, for one candidate replica."""

    learned: LearnedSlots
    """Its slots as learned so far (``SlotCapacity`` updates it)."""
    in_flight: int
    """Requests this host's router processes have in flight there."""
    num_running: int
    """Running requests, as it last reported."""
    num_waiting: int
    """Waiting requests, as it last reported."""
    max_num_seqs: int | None = None
    """Most requests it runs at once, as it says (None: not said)."""


class SlotCapacity:
    """Slots per replica, learned from reports (module doc) into each replica's ``LearnedSlots``; a count is trusted
    for ``ttl_s`` after it was last seen, then learned again (a replica that ran few long prompts may run many short
    ones later)."""

    def __init__(self, ttl_s: float = 30.0) -> None:
        self.ttl_s = ttl_s

    def observe(self, room: ReplicaRoom, now: float | None = None) -> None:
        """Learn from a report: waiting requests mean the running ones fill every slot; a stale count that runs more
        without waiting rises to it (``now``: the caller's clock; None: what is learned never expires)."""
        learned = room.learned
        if room.num_waiting > 0 and room.num_running > 0:
            learned.slots, learned.seen_at = room.num_running, math.inf if now is None else now
        elif (room.num_waiting == 0 and learned.slots is not None and self._stale(learned, now)
              and room.num_running > learned.slots):
            learned.slots = room.num_running  # still stale: probe on above it

    def has_room(self, room: ReplicaRoom, now: float | None = None) -> bool:
        self.observe(room, now)
        if room.in_flight == 0:
            return True
        cap, learned = room.max_num_seqs, room.learned
        if learned.slots is None:
            return room.in_flight < cap if cap else room.num_waiting == 0
        slots = learned.slots + 1 if self._stale(learned, now) else learned.slots  # stale: probe one above
        return room.in_flight < (min(slots, cap) if cap else slots)

    def _stale(self, learned: LearnedSlots, now: float | None) -> bool:
        return now is not None and now - learned.seen_at > self.ttl_s


class DrainRate:
    """Requests per second a queue sends on while it is backlogged -- what ``Retry-After`` and an arrival's
    expected wait are computed from. Only the time between departures with requests still waiting counts: a queue
    that empties measures its arrivals, not how fast it can drain, so a quiet spell neither lowers the rate nor
    makes the first burst after it look unservable. Departures and backlogged seconds are both decayed with time
    constant ``tau_s`` (of backlogged time); before any backlogged interval the rate is unknown (0)."""

    def __init__(self, tau_s: float = 5.0) -> None:
        self.tau_s = tau_s
        self._departures = 0.0  # decayed count over the backlogged intervals
        self._seconds = 0.0  # decayed backlogged seconds
        self._at: float | None = None  # the last departure
        self._backlogged = False  # requests still waited after it

    def record(self, now: float, still_waiting: bool) -> None:
        """One request went on at ``now``; ``still_waiting``: others remain in the queue after it."""
        if self._at is not None and self._backlogged:
            dt = max(0.0, now - self._at)
            keep = math.exp(-dt / self.tau_s)
            self._departures = self._departures * keep + 1.0
            self._seconds = self._seconds * keep + dt
        self._at, self._backlogged = now, still_waiting

    def rate(self, now: float) -> float:
        """Departures per second while backlogged, lately (0: not measured yet)."""
        return self._departures / self._seconds if self._seconds > 0 else 0.0

    def wait_s(self, ahead: int, now: float) -> float | None:
        """Seconds until ``ahead`` waiters have gone on at the current rate (None: no rate measured yet)."""
        rate = self.rate(now)
        if ahead <= 0:
            return 0.0
        return None if rate <= 0 else ahead / rate
