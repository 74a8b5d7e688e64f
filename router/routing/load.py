"""Per-replica load as the router sees it: its own in-flight requests plus the replica's ``/load``.

The router's own counters are exact and immediate; the replica's report (polled from its JSON
``/load``: running, waiting, KV usage, queued prefill tokens) also covers work other routers or
clients sent, but is a little stale. Router processes of one host (``--workers N``) also add each
other's counters (router/routing/shared_loads.py, ``LoadTracker.share``). Policies read the two combined
properties below.
"""

from __future__ import annotations

import math
import os
import time
import uuid
from typing import TYPE_CHECKING

from kvmesh.events.load import ReplicaLoadUpdate
from kvmesh.router.replicas.bookings import Bookings, PeerBookings
from kvmesh.router.replicas.load import PUBLISHED_FRESH_S, ReplicaLoad
from kvmesh.router.replicas.replica import Replica, ReplicaId
from kvmesh.router.replicas.replica_set import ReplicaSet

if TYPE_CHECKING:
    from kvmesh.router.routing.shared_loads import SharedLoadTable

__all__ = ["ARRIVAL_TAU_S", "BOOKING_MAX_AGE_S", "MAX_PEER_ROUTERS", "LoadTracker", "new_router_id"]

ARRIVAL_TAU_S = 30.0
"""Time constant of ``ReplicaLoad.arrival_rate``: the window over which a replica's request rate is counted."""
BOOKING_MAX_AGE_S = 2.0
"""Seconds after which a booking no published load acknowledged is taken for lost (its request failed on the way)."""
MAX_PEER_ROUTERS = 64
"""Other routers whose bookings one replica's load counts at once (``LoadTracker.peer_booked``): a feed that names
more router ids than that is refused beyond them, so it cannot grow a replica's record without bound."""


def new_router_id() -> str:
    """An id for one router process, unique across hosts and restarts (its bookings are numbered from 1)."""
    return f"{os.getpid()}-{uuid.uuid4().hex[:12]}"


class LoadTracker:
    """The router's per-replica loads (each on its replica's record); dispatch/first-token/finish keep the counters
    exact. ``replicas``: the router's set (None: a set of its own, whose replicas ``add_replica`` registers)."""

    def __init__(self, replicas: ReplicaSet | None = None, churn_tau_s: float = 300.0,
                 router_id: str | None = None) -> None:
        if not churn_tau_s > 0:
            raise ValueError(f"churn_tau_s must be > 0 seconds, got {churn_tau_s}")
        self.replicas = ReplicaSet() if replicas is None else replicas
        self.churn_tau_s = churn_tau_s
        """Time constant of ``ReplicaLoad.recent_prefill`` (about a cache's turnover time)."""
        self._churn_t0: float | None = None
        self.shared: SharedLoadTable | None = None
        """The host's ``SharedLoadTable`` (router/routing/shared_loads.py) when several router processes share
        their counts; None: this router counts alone."""
        self.row: int | None = None
        """This process's row in ``shared`` (None: it only reads, e.g. serve's control router)."""
        self._slotted: list | None = None
        self._num_slots = 0
        self.router_id = router_id or new_router_id()
        """This router's id in the replicas' published loads (``accepted``; router/replicas/bookings.py)."""
        self.replicas.on_added(self._added, locked=True)
        self.replicas.on_removed(self._removed, locked=True)

    @property
    def loads(self) -> dict[ReplicaId, ReplicaLoad]:
        """Replica id -> its record's load, read now (the id-keyed form the policies receive, filtered to healthy
        replicas; kept nowhere: each load lives on its record)."""
        return {r.id: r.load for r in self.replicas}

    @property
    def members_version(self) -> int:
        """Rises whenever a replica is added or removed (router/routing/cost/load_columns.py lays its rows out
        again)."""
        return self.replicas.members_version

    def share(self, table: SharedLoadTable, row: int | None) -> None:
        """Publish this router's counts in ``table``'s ``row`` (cleared first) and read the others'."""
        self.shared, self.row, self._slotted = table, row, None
        if row is not None:
            table.clear_row(row)
        for replica in self.replicas:
            load = replica.load
            load.shared_slot = table.slot(replica.id)
            self._publish(load)

    def refresh(self) -> None:
        """Take the other router processes' counts into ``peer_*`` (a no-op for a router alone)."""
        table = self.shared
        if table is None:
            return
        slotted = self._slotted
        if slotted is None:  # (load, slot) of every replica with a slot; rebuilt when the set changes
            slotted = self._slotted = [(load, 2 * load.shared_slot) for load in (r.load for r in self.replicas)
                                       if load.shared_slot is not None]
            self._num_slots = max((i // 2 + 1 for _, i in slotted), default=0)
        sums = table.peers(self.row, self._num_slots)
        for load, i in slotted:  # set only what changed: a set field makes its replica's row stale
            if load.peer_in_flight != sums[i]:
                load.peer_in_flight = sums[i]
            if load.peer_pending_prefill_tokens != sums[i + 1]:
                load.peer_pending_prefill_tokens = sums[i + 1]

    def _publish(self, load: ReplicaLoad) -> None:
        if self.row is not None and load.shared_slot is not None:
            self.shared.write(self.row, load.shared_slot, load.in_flight, load.pending_prefill_tokens)

    def _added(self, replica: Replica) -> None:
        self._slotted = None
        if self.shared is not None:
            replica.load.shared_slot = self.shared.slot(replica.id)  # an id seen before gets its old column

    def apply_published(self, replica: Replica, update: ReplicaLoadUpdate, now: float | None = None) -> bool:
        """Take the load ``replica`` published: its counts, plus this router's bookings it does not count yet, and
        its request rate and decayed prompt sums over every router's requests (``now``: the clock of
        ``on_dispatch``). False: not taken (not newer than the last, ``ReplicaLoad.apply_published``)."""
        load = replica.load
        now = time.monotonic() if now is None else now
        if replica.removed or not load.apply_published(update, now):
            return False
        bookings = load.bookings
        if bookings is None:
            bookings = load.bookings = Bookings()
        accepted = update.accepted
        bookings.acknowledge(accepted.get(self.router_id, 0), now, BOOKING_MAX_AGE_S)
        for peer, peer_bookings in load.peer_bookings.items():
            peer_bookings.acknowledge(accepted.get(peer, 0), now, BOOKING_MAX_AGE_S)
        load.other_routers = len(accepted) - (self.router_id in accepted)
        self._set_unacked(load)
        if update.churn_tau_s == self.churn_tau_s:  # the fleet's rates, which this router sees only its share of
            scale = self._churn_scale(now)
            load.recent_prefill = update.recent_prefill * scale
            load.recent_prompt = update.recent_prompt * scale
            load.recent_requests = update.recent_requests * scale
            load.arrival_rate, load.last_dispatch = update.arrival_rate, now
        return True

    def age_published(self, now: float | None = None) -> None:
        """Age every replica's bookings when its updates stopped or are refused (the router's tick,
        router/control/published_loads.py): a booking older than ``BOOKING_MAX_AGE_S`` is dropped, and a replica
        whose last update applied is older than ``PUBLISHED_FRESH_S`` stops publishing for this router
        (``stop_published``: its ``/load`` polls count again, and its next update is taken whatever its seq)."""
        now = time.monotonic() if now is None else now
        for replica in self.replicas:
            load = replica.load
            bookings = load.bookings
            if bookings is None:
                continue
            if now - load.published_at > PUBLISHED_FRESH_S:
                self.stop_published(replica)
            else:
                bookings.expire(now, BOOKING_MAX_AGE_S)
                peers = load.peer_bookings
                for peer, peer_bookings in list(peers.items()):
                    peer_bookings.expire(now, BOOKING_MAX_AGE_S)
                    if not peer_bookings.unacked_requests:
                        del peers[peer]  # a router that stopped choosing here (or restarted under a new id)
                self._set_unacked(load)

    def peer_booked(self, replica: Replica, router_id: str, number: int, tokens: int,
                    now: float | None = None) -> bool:
        """Another router (``router_id``) sent a request of ``tokens`` uncached prompt tokens to ``replica`` as its
        booking ``number`` (router/control/router_sync.py): count it here until the replica's published load
        acknowledges it or it is ``BOOKING_MAX_AGE_S`` old. False (nothing counted): the replica publishes no load
        (its ``/load`` polls count every router's requests), the id is this router's own, the booking is counted
        already, or ``MAX_PEER_ROUTERS`` other ids have bookings here."""
        load = replica.load
        if replica.removed or load.bookings is None or router_id == self.router_id:
            return False
        peers = load.peer_bookings
        peer_bookings = peers.get(router_id)
        if peer_bookings is None:
            if len(peers) >= MAX_PEER_ROUTERS:
                return False
            peer_bookings = peers[router_id] = PeerBookings()
            peer_bookings.acked = load.published_accepted.get(router_id, 0)
        if not peer_bookings.record(number, tokens, time.monotonic() if now is None else now):
            return False
        self._set_unacked(load)
        return True

    def stop_published(self, replica: Replica) -> None:
        """``replica``'s published load stopped (its stream was lost): its ``/load`` polls count again."""
        load = replica.load
        bookings = load.bookings
        if bookings is not None:
            load.bookings, load.published_seq = None, None
            bookings.forget()
            load.peer_bookings.clear()
            self._set_unacked(load)

    @staticmethod
    def _set_unacked(load: ReplicaLoad) -> None:
        """``unacked_*`` from this router's bookings and the other routers' it was told of."""
        own = load.bookings
        requests, tokens = (own.unacked_requests, own.unacked_tokens) if own is not None else (0, 0)
        for peer_bookings in load.peer_bookings.values():
            requests += peer_bookings.unacked_requests
            tokens += peer_bookings.unacked_tokens
        if load.unacked_requests != requests:
            load.unacked_requests = requests
        if load.unacked_prefill_tokens != tokens:
            load.unacked_prefill_tokens = tokens

    def _removed(self, replica: Replica) -> None:
        self._slotted = None
        slot = replica.load.shared_slot
        if self.row is not None and slot is not None:
            self.shared.write(self.row, slot, 0, 0)  # its requests no longer count here

    def on_dispatch(self, replica: Replica, uncached_tokens: int, now: float | None = None,
                    prompt_tokens: int = 0, sequences: int = 1) -> int | None:
        """A request of ``prompt_tokens`` was sent to ``replica``; it will prefill ``uncached_tokens`` tokens there
        and run ``sequences`` sequences, each one of its slots (``in_flight`` counts them, as the replica counts its
        running requests; ``now``: the clock the churn decays by, ``time.monotonic()`` when None). Returns its
        booking number when the replica publishes its load (the request carries it: ``bookings.booking_header``),
        else None. A replica removed meanwhile counts nothing."""
        number = None
        if not replica.removed:
            load = replica.load
            load.in_flight += sequences
            load.pending_prefill_tokens += uncached_tokens
            if self.shared is not None:
                self._publish(load)
            now = time.monotonic() if now is None else now
            bookings = load.bookings
            if bookings is not None:
                number = bookings.book(uncached_tokens, now)
                self._set_unacked(load)
            scale = self._churn_scale(now)  # may rebase recent_prefill
            load.recent_prefill += uncached_tokens * scale
            load.recent_prompt += max(prompt_tokens, uncached_tokens) * scale
            load.recent_requests += scale
            gap = 0.0 if load.last_dispatch is None else max(0.0, now - load.last_dispatch)
            load.arrival_rate = load.arrival_rate * math.exp(-gap / ARRIVAL_TAU_S) + 1 / ARRIVAL_TAU_S
            load.last_dispatch = now
        return number

    def _churn_scale(self, now: float) -> float:
        # Decay without touching every replica: a dispatch at `now` weighs exp((now - t0) / tau);
        # ratios between replicas are then those of the decayed sums. Rebased before it overflows.
        if self._churn_t0 is None:
            self._churn_t0 = now
        exponent = (now - self._churn_t0) / self.churn_tau_s
        if exponent > 200:
            shrink = math.exp(-exponent)  # may underflow to 0: that history is long forgotten anyway
            for load in (r.load for r in self.replicas):
                load.recent_prefill *= shrink
                load.recent_prompt *= shrink
                load.recent_requests *= shrink
            self._churn_t0, exponent = now, 0.0
        return math.exp(exponent)

    def reserve(self, replica: Replica, held: bool) -> None:
        """Count (``held``) or stop counting a request bound for the replica that is not sent yet (a P/D split's
        decode replica while the prefill replica computes the prompt), so admission sees the slot taken."""
        if not replica.removed:
            load = replica.load
            load.in_flight = load.in_flight + 1 if held else max(0, load.in_flight - 1)
            if self.shared is not None:
                self._publish(load)

    def on_first_output(self, replica: Replica, uncached_tokens: int) -> None:
        """The request produced its first byte: its prefill is done."""
        if not replica.removed:
            load = replica.load
            load.pending_prefill_tokens = max(0, load.pending_prefill_tokens - uncached_tokens)
            if self.shared is not None:
                self._publish(load)

    def on_finish(self, replica: Replica, uncached_tokens: int, had_output: bool, sequences: int = 1) -> None:
        """The request of ``sequences`` finished (or failed); ``had_output`` says whether on_first_output ran."""
        if not replica.removed:
            load = replica.load
            load.in_flight = max(0, load.in_flight - sequences)
            if not had_output:
                load.pending_prefill_tokens = max(0, load.pending_prefill_tokens - uncached_tokens)
            if self.shared is not None:
                self._publish(load)
