"""The routers that asked a publisher for its replica's load (events/load.py), and what they are sent.

The publisher's I/O thread owns it: a ``LOAD_REQUEST`` on the replay socket puts its asker on the list for
``LOAD_LEASE_S`` and sends it the latest update at once (a late router gets the latest); every later update goes
to every asker whose lease runs, as ``[identity, b"", LOAD_TAG, seq, payload]``. An update is a whole load, so a
lost one costs nothing the next does not bring; a peer the ROUTER socket cannot send to (gone, or at its
high-water mark) misses it.

Nothing proves who asks on a plain stream, so no stranger may crowd the real routers out, by peer address (the TCP
source, which a ZeroMQ peer cannot choose as it chooses its identity):

- each address asks at most ``ASKS_PER_S`` times a second (``ASK_BURST`` at once), apart from every other address:
  a flood from one address never delays another's renewal;
- each address holds at most ``MAX_LEASES_PER_ADDRESS`` leases (a host's router processes, one each); beyond it
  its own lease that ends first gives way;
- beyond ``MAX_LOAD_SUBSCRIBERS`` in all, a lease of the address holding the most gives way.

A router alone on its host's address is so displaced only when more than ``MAX_LOAD_SUBSCRIBERS`` other addresses
each hold a lease at least as many; a private stream (CURVE) admits no stranger at all.
"""

from __future__ import annotations

import time
from collections import OrderedDict

import zmq
from kvmesh.events.load import LOAD_LEASE_S
from kvmesh.events.ratelimit import TokenBucket
from kvmesh.events.wire import LOAD_TAG, pack_seq

__all__ = ["LoadSubscribers", "MAX_LEASES_PER_ADDRESS", "MAX_LOAD_SUBSCRIBERS"]

MAX_LOAD_SUBSCRIBERS = 1024
"""Askers kept at once; beyond it a lease of the address holding the most gives way."""
MAX_LEASES_PER_ADDRESS = 32
"""Leases one peer address holds at once (a router process holds one per replica)."""
ASKS_PER_S = 20.0
"""Load requests one peer address may make per second (a router process asks once per ``LOAD_LEASE_S / 3``)."""
ASK_BURST = 40
"""Load requests one peer address may make at once before ``ASKS_PER_S`` applies."""
MAX_ADDRESSES = 4096
"""Peer addresses whose request budget is kept; the least recently seen is forgotten beyond it."""
_NOBLOCK = int(zmq.NOBLOCK)


class LoadSubscribers:
    """Leases of load subscribers and the latest update (I/O thread only, but ``offer`` from any thread)."""

    def __init__(self, lease_s: float = LOAD_LEASE_S) -> None:
        self.lease_s = lease_s
        self._leases: dict[bytes, tuple[float, str]] = {}  # identity -> (monotonic end of its lease, peer address)
        self._held: dict[str, dict[bytes, float]] = {}  # peer address -> its identities' lease ends
        self._asks: OrderedDict[str, TokenBucket] = OrderedDict()  # peer address -> its request budget
        self._latest: tuple[int, bytes] | None = None
        self._offered: tuple[int, bytes] | None = None  # set by ``offer`` (any thread), taken by ``send_offered``
        self.sent = 0
        """Updates sent (one per subscriber and update)."""
        self.throttled = 0
        """Load requests dropped: their address asked beyond ``ASKS_PER_S``."""

    @property
    def count(self) -> int:
        """Subscribers whose lease runs now."""
        now = time.monotonic()
        return sum(1 for end, _ in self._leases.values() if end > now)

    def offer(self, seq: int, payload: bytes) -> None:
        """A new update (any thread; a newer offer replaces one not sent yet: only the latest load matters)."""
        self._offered = (seq, payload)

    def pending(self) -> bool:
        return self._offered is not None

    def subscribe(self, socket: zmq.Socket, identity: bytes, address: str = "") -> bool:
        """``identity`` asked from peer ``address``: (re)start its lease and send it the latest update, if any;
        False (nothing done) when its address asked beyond its budget."""
        if not self._budget(address).take():
            self.throttled += 1
            return False
        end = time.monotonic() + self.lease_s
        held = self._held.setdefault(address, {})
        if identity not in held:
            self._drop(identity)  # it may have asked from another address before
            if len(held) >= MAX_LEASES_PER_ADDRESS:
                self._drop(min(held, key=held.__getitem__))
            self._held[address] = held  # (dropping its last lease forgot the address)
        self._leases[identity] = (end, address)
        held[identity] = end
        if len(self._leases) > MAX_LOAD_SUBSCRIBERS:
            largest = max(self._held.values(), key=len)
            self._drop(min(largest, key=largest.__getitem__))
        if self._latest is not None and identity in self._leases:
            self._send(socket, identity, *self._latest)
        return True

    def _budget(self, address: str) -> TokenBucket:
        asks = self._asks
        bucket = asks.get(address)
        if bucket is None:
            bucket = asks[address] = TokenBucket(ASKS_PER_S, ASK_BURST)
            if len(asks) > MAX_ADDRESSES:
                asks.popitem(last=False)
        else:
            asks.move_to_end(address)
        return bucket

    def _drop(self, identity: bytes) -> None:
        lease = self._leases.pop(identity, None)
        if lease is not None:
            held = self._held[lease[1]]
            del held[identity]
            if not held:
                del self._held[lease[1]]

    def send_offered(self, socket: zmq.Socket) -> None:
        """Send the offered update to every subscriber whose lease runs; forget those whose lease ended."""
        offered, self._offered = self._offered, None
        if offered is None:
            return
        self._latest = offered
        now = time.monotonic()
        for identity, (end, _) in list(self._leases.items()):
            if end <= now:
                self._drop(identity)
            else:
                self._send(socket, identity, *offered)

    def _send(self, socket: zmq.Socket, identity: bytes, seq: int, payload: bytes) -> None:
        try:
            socket.send_multipart((identity, b"", LOAD_TAG, pack_seq(seq), payload), _NOBLOCK)
            self.sent += 1
        except zmq.Again:
            pass  # at its high-water mark: the next update brings the whole load again
