"""A router's own requests to one replica that the replica's published load does not count yet.

A replica that publishes its load (events/load.py, ``ReplicaLoadUpdate``) counts every request it accepted,
whichever router sent it, and says per router the highest booking number it accepted from it. Between two
updates a router adds to that load only its own bookings above that number::

    book(tokens)        -> n          the request carries "<router id>:<n>:<tokens>" to the replica
                                      (replica/openai/router_booking.py)
    acknowledge(m, now)               the update says the replica accepted up to m: bookings <= m are counted there
    unacked_requests / unacked_tokens what the router adds to the published load

N routers with no shared memory then see one replica's load alike, each its own bookings apart, within one
publish of each other. A booking the replica never accepted (the request failed on the way) is dropped once a
later booking is acknowledged, or once it is ``max_age_s`` old (``expire``: on every update, and on the router's
aging tick when updates stop or are refused). An acknowledgement beyond the last booking acknowledges no more than
was booked: a replica cannot move a router's numbering.
"""

from __future__ import annotations

from collections import deque

__all__ = ["Bookings", "PeerBookings"]

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
        those older than ``max_age_s`` (lost on the way: the replica would have counted them by now). A number beyond
        the last booking counts as the last (a router's id is its process's: no booking of it came before)."""
        self.acked = max(self.acked, min(acked, self.last))
        open_ = self._open
        while open_ and open_[0][0] <= self.acked:
            self.unacked_tokens -= open_.popleft()[1]
        self.expire(now, max_age_s)

    def expire(self, now: float, max_age_s: float) -> None:
        """Drop the bookings older than ``max_age_s`` at ``now``."""
        open_, horizon = self._open, now - max_age_s
        while open_ and open_[0][2] < horizon:
            self.unacked_tokens -= open_.popleft()[1]

    def forget(self) -> None:
        """Drop every booking (the replica restarted or stopped publishing)."""
        self._open.clear()
        self.unacked_tokens = 0


class PeerBookings(Bookings):
    """Another router's bookings on one replica, as its choices reached this router (router/control/router_sync.py):
    numbered by that router, acknowledged by the replica's published load as that router's own are.

    The feed and the replica's updates race: an acknowledgement may come before the booking it covers, so the
    highest acknowledged number is kept as the replica said it (not cut at the last booking seen), and a booking at
    or below it is already counted there and not recorded. A number at or below the last recorded is a repeat."""

    __slots__ = ()

    def record(self, number: int, tokens: int, now: float) -> bool:
        """Count the other router's booking ``number`` of ``tokens`` uncached prompt tokens, received at ``now``;
        False (nothing counted) when the replica already counts it or it repeats one recorded."""
        if number <= self.last or number <= self.acked:
            return False
        self.last = number
        self._open.append((number, tokens, now))
        self.unacked_tokens += tokens
        return True

    def acknowledge(self, acked: int, now: float, max_age_s: float) -> None:
        """The replica accepted the other router's bookings up to ``acked``: drop those, and those older than
        ``max_age_s``."""
        self.acked = max(self.acked, acked)
        open_ = self._open
        while open_ and open_[0][0] <= self.acked:
            self.unacked_tokens -= open_.popleft()[1]
        self.expire(now, max_age_s)
