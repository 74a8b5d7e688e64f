"""A router's own requests to one replica that the replica's published load does not count yet.

A replica that publishes its load (events/load.py, ``ReplicaLoadUpdate``) counts every request it accepted,
whichever router sent it, and says per router the highest booking number it accepted from it. Between two
updates a router adds to that load only its own bookings above that number::

    book(tokens)        -> n          the request carries "<router id>:<n>" (ROUTER_HEADER) to the replica
    acknowledge(m, now)               the update says the replica accepted up to m: bookings <= m are counted there
    unacked_requests / unacked_tokens what the router adds to the published load

N routers with no shared memory then see one replica's load alike, each its own bookings apart, within one
publish of each other. A booking the replica never accepted (the request failed on the way) is dropped once a
later booking is acknowledged, or once it is ``max_age_s`` old while updates keep coming.
"""

from __future__ import annotations

from collections import deque

__all__ = ["ROUTER_HEADER", "Bookings", "booking_header", "parse_booking"]

ROUTER_HEADER = "x-kvmesh-router"
"""The router's header on a request to a replica: ``<router id>:<booking number>``, echoed back in the replica's
published load (the highest booking number it accepted per router id)."""
MAX_ROUTER_ID_CHARS = 64
"""A longer router id is refused by the replica (ids are short: a host and a process)."""
MAX_ROUTERS_PER_REPLICA = 256
"""Router ids a replica keeps accepted counts for; the least recently seen is forgotten beyond it."""


def booking_header(router_id: str, number: int) -> dict[str, str]:
    """The header a router sends with booking ``number`` of ``router_id``."""
    return {ROUTER_HEADER: f"{router_id}:{number}"}


def parse_booking(value: str) -> tuple[str, int]:
    """``(router id, booking number)`` of a ``ROUTER_HEADER`` value; ValueError saying what is wrong."""
    router_id, sep, number = value.rpartition(":")
    if not sep or not router_id or len(router_id) > MAX_ROUTER_ID_CHARS or not number.isdigit():
        raise ValueError(f"header {ROUTER_HEADER} must be '<router id of 1 to {MAX_ROUTER_ID_CHARS} characters>:"
                         f"<booking number>', got {value[:80]!r}")
    return router_id, int(number)


class Bookings:
    """This router's bookings on one replica, numbered from 1, and which the replica has not acknowledged."""

    __slots__ = ("last", "acked", "_open", "unacked_tokens")

    def __init__(self) -> None:
        self.last = 0
        """Number of the latest booking (0: none yet)."""
        self.acked = 0
        """Highest booking number the replica said it accepted."""
        self._open: deque[tuple[int, int, float]] = deque()
        self.unacked_tokens = 0
        """Uncached prompt tokens of the bookings the replica has not acknowledged."""

    @property
    def unacked_requests(self) -> int:
        """Bookings the replica has not acknowledged."""
        return len(self._open)

    def book(self, tokens: int, now: float) -> int:
        """Count a request of ``tokens`` uncached prompt tokens sent at ``now``; returns its booking number."""
        self.last += 1
        self._open.append((self.last, tokens, now))
        self.unacked_tokens += tokens
        return self.last

    def acknowledge(self, acked: int, now: float, max_age_s: float) -> None:
        """The replica accepted bookings up to ``acked`` (as of an update received at ``now``): drop those, and
        those older than ``max_age_s`` (lost on the way: the replica would have counted them by now)."""
        if acked > self.last:  # a number from before this router restarted: its bookings start above it
            self.last = acked
        self.acked = max(self.acked, acked)
        open_, horizon = self._open, now - max_age_s
        while open_ and (open_[0][0] <= self.acked or open_[0][2] < horizon):
            self.unacked_tokens -= open_.popleft()[1]

    def forget(self) -> None:
        """Drop every booking (the replica restarted or stopped publishing)."""
        self._open.clear()
        self.unacked_tokens = 0
