"""The routers that asked a publisher for its replica's load (events/load.py), and what they are sent.

The publisher's I/O thread owns it: a ``LOAD_REQUEST`` on the replay socket puts its asker on the list for
``LOAD_LEASE_S`` and sends it the latest update at once (a late router gets the latest); every later update goes
to every asker whose lease runs, as ``[identity, b"", LOAD_TAG, seq, payload]``. An update is a whole load, so a
lost one costs nothing the next does not bring; a peer the ROUTER socket cannot send to (gone, or at its
high-water mark) misses it.
"""

from __future__ import annotations

import time

import zmq
from kvmesh.events.load import LOAD_LEASE_S
from kvmesh.events.wire import LOAD_TAG, pack_seq

__all__ = ["LoadSubscribers", "MAX_LOAD_SUBSCRIBERS"]

MAX_LOAD_SUBSCRIBERS = 1024
"""Askers kept at once; the one whose lease ends first is dropped beyond it (a flood of identities costs no more)."""
_NOBLOCK = int(zmq.NOBLOCK)


class LoadSubscribers:
    """Leases of load subscribers and the latest update (I/O thread only, but ``offer`` from any thread)."""

    def __init__(self, lease_s: float = LOAD_LEASE_S) -> None:
        self.lease_s = lease_s
        self._leases: dict[bytes, float] = {}  # identity -> monotonic end of its lease
        self._latest: tuple[int, bytes] | None = None
        self._offered: tuple[int, bytes] | None = None  # set by ``offer`` (any thread), taken by ``send_offered``
        self.sent = 0
        """Updates sent (one per subscriber and update)."""

    @property
    def count(self) -> int:
        """Subscribers whose lease runs now."""
        now = time.monotonic()
        return sum(1 for end in self._leases.values() if end > now)

    def offer(self, seq: int, payload: bytes) -> None:
        """A new update (any thread; a newer offer replaces one not sent yet: only the latest load matters)."""
        self._offered = (seq, payload)

    def pending(self) -> bool:
        return self._offered is not None

    def subscribe(self, socket: zmq.Socket, identity: bytes) -> None:
        """``identity`` asked: (re)start its lease and send it the latest update, if any."""
        leases = self._leases
        leases[identity] = time.monotonic() + self.lease_s
        if len(leases) > MAX_LOAD_SUBSCRIBERS:
            del leases[min(leases, key=leases.__getitem__)]
        if self._latest is not None:
            self._send(socket, identity, *self._latest)

    def send_offered(self, socket: zmq.Socket) -> None:
        """Send the offered update to every subscriber whose lease runs; forget those whose lease ended."""
        offered, self._offered = self._offered, None
        if offered is None:
            return
        self._latest = offered
        now = time.monotonic()
        for identity, end in list(self._leases.items()):
            if end <= now:
                del self._leases[identity]
            else:
                self._send(socket, identity, *offered)

    def _send(self, socket: zmq.Socket, identity: bytes, seq: int, payload: bytes) -> None:
        try:
            socket.send_multipart((identity, b"", LOAD_TAG, pack_seq(seq), payload), _NOBLOCK)
            self.sent += 1
        except zmq.Again:
            pass  # at its high-water mark: the next update brings the whole load again
