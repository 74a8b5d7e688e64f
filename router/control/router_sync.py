"""Routers that see each other's choices as they are made: the sync stream between routers of one service.

Routers on several hosts each follow every replica's KV events and published load, but a request another router
sent a moment ago shows in neither until the replica has taken it: inside a burst (an agent's fan-out, a batch
client) every router decides on the same stale view and they pile onto the same replica. With sync on, each router
publishes every request it sends (the replica, its booking number, its uncached tokens, its prompt's block keys:
router/control/sync_wire.py) on a ZeroMQ PUB socket, and subscribes to the others'::

    router A  ── PUB (sync.bind) ──▶  router B's SUB  ──▶  B's loop:  LoadTracker.peer_booked  (the load it adds)
                                                                      PrefixIndex.predict      (the blocks it lands)

A peer's booking counts on that replica until the replica's published load acknowledges it (the load's
``accepted`` names every router: router/replicas/bookings.py ``PeerBookings``) or ``BOOKING_MAX_AGE_S`` passes; its
blocks count as held there for ``predict_ttl_s``, as the router's own predictions do, until the replica's events
confirm them; with ``predict_hold_s`` they are held until the sending router says the replica answered
(``release``, router/routing/peer_holds.py). Delivery is best-effort (a PUB drops what a slow subscriber cannot take):
a lost choice costs only what the router would have decided without it (a lost release: its hold lasts the backstop).

Each peer is read on this module's own thread within ``choices_per_s`` (a ``TokenBucket``: a flood waits in
ZeroMQ's queue and then is dropped by the publisher's high-water mark); what it sends is decoded and checked
(``sync_wire.check``) before the loop sees it, and the loop applies a turn's choices in one call. With the
events' CURVE keys set (``router.events``: a served cluster's routers share one keypair) the PUB is a CURVE server
admitting only that key, and each SUB a client of it: a stranger neither reads the choices nor sends any.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections import deque
from typing import TYPE_CHECKING

import zmq
from kvmesh.events import curve
from kvmesh.router.control.sync_peer import SyncPeer
from kvmesh.router.control.sync_wire import (
    MAX_SYNC_FRAME_BYTES,
    SYNC_CONTEXT_TOKENS,
    TOPIC,
    RouterChoice,
    RouterChoices,
    encode_choices,
    key_check,
)
from kvmesh.router.control.turns import TakingTurns
from kvmesh.router.routing.peer_holds import PeerHolds

if TYPE_CHECKING:
    from kvmesh.events.config import SubscriberConfig
    from kvmesh.router.config import RouterConfig, SyncConfig
    from kvmesh.router.replicas.replica import Replica
    from kvmesh.router.routing.kv_router import KVRouter

__all__ = ["RouterSync"]

logger = logging.getLogger(__name__)

MAX_PENDING = 1 << 16
"""Choices waiting for the loop at most; beyond, new ones are dropped and counted (a loop that far behind gains
nothing from choices older than its turn)."""
_POLL_MS = 100
_NOBLOCK = int(zmq.NOBLOCK)


class RouterSync(TakingTurns):
    """Publishes ``router``'s choices and applies the other routers' (see the module doc). ``max_keys``: the most
    blocks one prompt has (a longer key list is refused)."""

    def __init__(self, router: KVRouter, config: SyncConfig, events: SubscriberConfig, max_keys: int,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.router, self.config, self.max_keys, self.loop = router, config, max_keys, loop
        self.key_check = key_check(router.hasher.seed)
        """Names this router's key seed in its messages (sync_wire.py)."""
        self._keypair = (events.curve_public_key, events.curve_secret_key) if events.curve_public_key else None
        self._ctx: zmq.Context = zmq.Context()  # its own: the CURVE allow-list (a ZAP handler) is per context
        self._auth = None
        self._pub: zmq.Socket | None = None
        self._pub_lock = threading.Lock()
        self._seq = 0
        self._holds = itertools.count(1)
        self.peer_holds = PeerHolds(router)
        """The other routers' held predictions in this router's index."""
        self.endpoint: str | None = None
        """Where this router publishes its choices (``config.bind`` with its port resolved); None: it publishes none."""
        self.published = 0
        """Choices sent."""
        self.send_dropped = 0
        """Choices not sent: every subscriber's queue was full (ZeroMQ's high-water mark)."""
        self.applied = 0
        """Other routers' choices applied (a booking counted or blocks predicted)."""
        self.unknown_replica = 0
        """Other routers' choices for a replica not in this router's set (not yet, or no longer)."""
        self.overflow = 0
        """Other routers' choices dropped while ``MAX_PENDING`` waited for the loop."""
        self.turn_waits = 0
        """Requests that waited for this router's turn to decide (turns.py)."""
        self.turn_wait_seconds = 0.0
        """Seconds those requests waited, in all."""
        self._peers: dict[str, SyncPeer] = {}
        self._wanted: tuple[str, ...] = tuple(config.peers)
        self._changed = threading.Event()
        self._pending: deque[tuple[str, RouterChoice]] = deque()
        self._lock = threading.Lock()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="kvmesh-router-sync", daemon=True)

    @classmethod
    def started(cls, router: KVRouter, config: RouterConfig, context_tokens: int | None,
                loop: asyncio.AbstractEventLoop) -> RouterSync | None:
        """The stream of a router built from ``config``, started; None when ``config.sync`` is off.
        ``context_tokens``: the model's context as the router's tokenizer knows it (``max_model_len`` wins; neither:
        ``SYNC_CONTEXT_TOKENS``), which bounds a peer's key list."""
        if not config.sync.enabled:
            return None
        max_len = config.max_model_len or context_tokens or SYNC_CONTEXT_TOKENS
        return cls(router, config.sync, config.events, max_len // router.block_size + 1, loop).start()

    # ------------------------------------------------------------------ publishing
    def start(self) -> RouterSync:
        if self.config.bind is not None:
            sock = self._ctx.socket(zmq.PUB)
            sock.setsockopt(zmq.LINGER, 0)
            if self._keypair is not None:
                self._auth = curve.start_authenticator(self._ctx, (self._keypair[0],))
                curve.make_server(sock, self._keypair[1])
            elif not curve.is_loopback(self.config.bind):
                logger.warning("router sync %s is PLAIN TEXT beyond loopback: anyone who reaches it reads the block "
                               "keys of every request and can send choices of its own; set the events' CURVE keys "
                               "(router.events.curve_public_key / curve_secret_key)", self.config.bind)
            sock.bind(self.config.bind)
            self.endpoint = sock.getsockopt(zmq.LAST_ENDPOINT).decode()
            self._pub = sock
        self._changed.set()  # follow config.peers
        self._thread.start()
        publishing = self._pub is not None
        self.router.choices_out = self.publish if publishing else None
        self.router.holds_out = self.release if publishing else None
        return self

    def publish(self, replica: Replica, booking: int, uncached_tokens: int, keys: list[int],
                held: bool = False) -> int:
        """Tell the other routers of a request sent to ``replica`` (the router's loop; any thread may call); with
        ``held`` (its prediction held: ``predict_hold_s``), the number ``release`` gives back, else 0."""
        hold = next(self._holds) if held else 0
        self._send(RouterChoice(replica.id, booking, uncached_tokens, keys, hold))
        return hold

    def release(self, replica: Replica, hold: int) -> None:
        """Tell the other routers that the request ``publish`` numbered ``hold`` was answered, or left ``replica``."""
        self._send(RouterChoice(replica.id, 0, 0, [], hold))

    def _send(self, choice: RouterChoice) -> None:
        with self._pub_lock:
            if self._pub is None:
                return
            self._seq += 1
            frame = encode_choices(RouterChoices(self.router.loads.router_id, self._seq, self.key_check, [choice]))
            try:
                self._pub.send_multipart((TOPIC, frame), _NOBLOCK)
                self.published += 1
            except zmq.Again:
                self.send_dropped += 1

    # ------------------------------------------------------------------ subscribing
    def set_peers(self, endpoints: list[str] | tuple[str, ...]) -> None:
        """Follow exactly ``endpoints`` (the other routers' ``endpoint``; this router's own is skipped), any thread."""
        with self._lock:
            self._wanted = tuple(e for e in endpoints if e != self.endpoint)
        self._changed.set()

    @property
    def peers(self) -> tuple[str, ...]:
        return self._wanted

    def counters(self) -> dict[str, object]:
        """What the stream did: this router's choices sent and dropped, the others' applied and dropped, and per
        peer endpoint its counters (any thread)."""
        return {"endpoint": self.endpoint, "published": self.published, "send_dropped": self.send_dropped,
                "applied": self.applied, "unknown_replica": self.unknown_replica, "overflow": self.overflow,
                "turn_waits": self.turn_waits, "turn_wait_seconds": self.turn_wait_seconds,
                "peers": {p.endpoint: p.counters() for p in list(self._peers.values())}}

    def close(self) -> None:
        self._stop = True
        self._changed.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2.0)
        self.router.choices_out = self.router.holds_out = None
        with self._pub_lock:
            if self._pub is not None:
                self._pub.close(linger=0)
                self._pub = None
        if self._auth is not None:
            self._auth.stop()
        self._ctx.destroy(linger=0)

    def _run(self) -> None:
        poller = zmq.Poller()
        try:
            while not self._stop:
                if self._changed.is_set():
                    self._changed.clear()
                    self._follow(poller)
                if not self._peers:
                    self._changed.wait(0.5)
                    continue
                self._turn(poller)
        finally:
            for peer in self._peers.values():
                peer.sock.close(linger=0)

    def _follow(self, poller: zmq.Poller) -> None:
        with self._lock:
            wanted = set(self._wanted)
        for endpoint in [e for e in self._peers if e not in wanted]:
            peer = self._peers.pop(endpoint)
            poller.register(peer.sock, 0)  # unregistered (a no-op when its budget had it out)
            peer.sock.close(linger=0)
        for endpoint in sorted(wanted - self._peers.keys()):
            sock = self._ctx.socket(zmq.SUB)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.MAXMSGSIZE, MAX_SYNC_FRAME_BYTES)
            if self._keypair is not None:
                curve.make_client(sock, self._keypair[0], *self._keypair)
            sock.setsockopt(zmq.SUBSCRIBE, TOPIC)
            try:
                sock.connect(endpoint)
            except zmq.ZMQError as e:
                logger.warning("router sync: cannot follow %s (%s)", endpoint, e)
                sock.close(linger=0)
                continue
            self._peers[endpoint] = SyncPeer(endpoint, sock, self.config.choices_per_s, self.config.choice_burst)
            poller.register(sock, zmq.POLLIN)

    def _turn(self, poller: zmq.Poller) -> None:
        """Read every peer with budget left; a peer without is not polled until its bucket refilled."""
        wait_ms = _POLL_MS
        for peer in self._peers.values():
            wait = peer.budget.wait_s(1.0)
            poller.modify(peer.sock, 0 if wait > 0 else zmq.POLLIN)
            if wait > 0:
                wait_ms = min(wait_ms, max(1, int(wait * 1000)))
        owner = {p.sock: p for p in self._peers.values()}
        taken: list[tuple[str, RouterChoice]] = []
        for sock, _ in poller.poll(wait_ms):
            peer = owner.get(sock)
            if peer is not None:
                peer.read(taken, self.key_check, self.max_keys)
        if taken:
            self._hand_over(taken)

    def _hand_over(self, taken: list[tuple[str, RouterChoice]]) -> None:
        with self._lock:
            first = not self._pending
            room = MAX_PENDING - len(self._pending)
            if len(taken) > room:
                self.overflow += len(taken) - room
                taken = taken[:room]
            self._pending.extend(taken)
        if first and taken:
            self.loop.call_soon_threadsafe(self._apply)

    def _apply(self) -> None:
        """The loop: count the other routers' bookings and predict their blocks."""
        with self._lock:
            pending, self._pending = self._pending, deque()
        router, now = self.router, time.monotonic()
        for router_id, choice in pending:
            replica = router.replicas.get(choice.replica_id)
            if replica is None or replica.removed:
                self.unknown_replica += 1
                continue
            if choice.booking:
                router.loads.peer_booked(replica, router_id, choice.booking, choice.uncached_tokens, now)
            if router_id != router.loads.router_id and (choice.keys or choice.hold):
                with router.lock:
                    if not choice.keys:
                        self.peer_holds.release(router_id, choice.hold, now)
                    elif choice.hold:
                        self.peer_holds.hold(router_id, choice.hold, replica, choice.keys, now)
                    else:
                        router.index.predict(replica.id, choice.keys, now=now)
            self.applied += 1
