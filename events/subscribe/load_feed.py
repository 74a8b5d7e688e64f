"""A router's subscription to its replicas' published loads (events/load.py): one DEALER per replica's replay socket.

    add_source(name, replay endpoint, curve server key)     ask at once, then every ``renew_s``
    on_load(name, update)                                   each update, on this feed's thread

Its own thread and sockets, apart from the KV event feed (feed_loop.py), whose DEALERs carry one request at a time
and are replaced on a timeout: a load update may come any time. A replica that answers a load request with a
replay end marker (vLLM's answer to a request it does not know) publishes no load: ``on_absent`` says so once, and
the router keeps polling its ``/load``. An undecodable frame is counted (``bad_frames``) and dropped; an update is
checked at intake (events/load_check.py) and a malformed one refused, counted (``refused``) and logged once per
source. Each source passes on at most ``updates_per_s`` updates a second, its newest (events/subscribe/load_source.py),
so a flood costs the router's loop no more than an honest replica does.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

import msgspec
import zmq
from kvmesh.events import curve
from kvmesh.events.load import LOAD_LEASE_S, ReplicaLoadUpdate, decode_load_update
from kvmesh.events.load_check import admit
from kvmesh.events.subscribe.load_source import (
    FRAMES_PER_UPDATE,
    LOAD_RCVHWM,
    MAX_FRAMES_PER_TURN,
    LoadSource,
)
from kvmesh.events.wire import END_SEQ, LOAD_REQUEST, LOAD_TAG

__all__ = ["LoadFeed"]

logger = logging.getLogger(__name__)

MAX_LOAD_FRAME_BYTES = 1 << 20
"""Largest frame a load DEALER accepts (an update is ~100 bytes plus ~40 per router id; ZeroMQ drops bigger)."""
_NOBLOCK = int(zmq.NOBLOCK)
_IDLE_WAIT_S = 0.1
"""How long a feed with no source waits for one before looking at ``close`` again."""
_POLL_MS = 100
"""Longest wait for a frame before the feed looks at its calls, renewals and ``close`` again."""


class LoadFeed:
    """Follows the published loads of named replicas (see the module doc)."""

    def __init__(self, on_load: Callable[[str, ReplicaLoadUpdate], None],
                 on_absent: Callable[[str], None] | None = None, renew_s: float = LOAD_LEASE_S / 3,
                 curve_keypair: tuple[str, str] | None = None, updates_per_s: float = 1000.0,
                 update_burst: int = 50) -> None:
        self.on_load, self.on_absent, self.renew_s = on_load, on_absent, renew_s
        self.updates_per_s, self.update_burst = updates_per_s, update_burst
        self._keypair = curve_keypair
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._sources: dict[str, LoadSource] = {}
        self._owner: dict[zmq.Socket, LoadSource] = {}
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="kvmesh-load-feed", daemon=True)

    @property
    def updates(self) -> int:
        """Updates passed on (all sources)."""
        return sum(s.updates for s in list(self._sources.values()))

    @property
    def bad_frames(self) -> int:
        """Frames dropped: not a load update, or undecodable (all sources)."""
        return sum(s.bad_frames for s in list(self._sources.values()))

    @property
    def refused(self) -> int:
        """Updates refused at intake (all sources)."""
        return sum(s.refused for s in list(self._sources.values()))

    @property
    def throttled(self) -> int:
        """Load frames dropped undecoded (all sources)."""
        return sum(s.throttled for s in list(self._sources.values()))

    def counters(self) -> dict[str, dict[str, int]]:
        """Each source's counters (``LoadSource.counters``), by name (any thread)."""
        return {name: source.counters() for name, source in list(self._sources.items())}

    def start(self) -> LoadFeed:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop = True
        self._thread.join(timeout=2.0)

    def add_source(self, name: str, replay_endpoint: str, curve_server_key: str | None = None) -> None:
        """Follow ``name``'s load from its replay socket (any thread)."""
        self._calls.put((name, replay_endpoint, curve_server_key))

    def remove_source(self, name: str) -> None:
        """Stop following ``name`` (any thread)."""
        self._calls.put((name, None, None))

    def _run(self) -> None:
        poller = zmq.Poller()
        try:
            while not self._stop:
                self._take_calls(poller, 0.0 if self._sources else _IDLE_WAIT_S)
                self._renew()
                if self._sources:
                    self._turn(poller)
        finally:
            for source in self._sources.values():
                source.sock.close(linger=0)

    def _turn(self, poller: zmq.Poller) -> None:
        """Wait for frames of the sources within their budget (a source beyond it is not polled until it refilled),
        then read them."""
        wait_ms, polled = _POLL_MS, 0
        for source in self._sources.values():
            wait = source.wait_s()
            if wait > 0:
                wait_ms = min(wait_ms, max(1, int(wait * 1000)))
            poller.register(source.sock, 0 if wait > 0 else zmq.POLLIN)
            polled += wait <= 0
        if not polled:  # zmq polls no socket at once
            time.sleep(wait_ms / 1000)
            return
        for sock, _ in poller.poll(wait_ms):
            source = self._owner.get(sock)
            if source is not None:
                self._read(source)

    def _take_calls(self, poller: zmq.Poller, wait_s: float) -> None:
        """Apply the pending ``add_source``/``remove_source`` calls, waiting up to ``wait_s`` for the first."""
        while True:
            try:
                name, endpoint, server_key = self._calls.get(timeout=wait_s) if wait_s else self._calls.get_nowait()
            except queue.Empty:
                return
            wait_s = 0.0
            old = self._sources.pop(name, None)
            if old is not None:
                poller.register(old.sock, 0)  # unregistered (a no-op while it waits out its budget)
                del self._owner[old.sock]
                old.sock.close(linger=0)
            if endpoint is not None:
                source = LoadSource(name, self._connect(endpoint, server_key), self.updates_per_s, self.update_burst)
                self._sources[name], self._owner[source.sock] = source, source
                poller.register(source.sock, zmq.POLLIN)

    def _connect(self, endpoint: str, server_key: str | None) -> zmq.Socket:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_LOAD_FRAME_BYTES)
        sock.setsockopt(zmq.RCVHWM, LOAD_RCVHWM)
        if server_key is not None:
            if self._keypair is None:
                self._keypair = curve.generate_keypair()
            curve.make_client(sock, server_key, *self._keypair)
        sock.connect(endpoint)
        return sock

    def _renew(self) -> None:
        now = time.monotonic()
        for source in self._sources.values():
            if source.asked is None or now - source.asked >= self.renew_s:
                source.asked = now
                try:
                    source.sock.send_multipart((b"", LOAD_REQUEST), _NOBLOCK)
                except zmq.Again:
                    pass  # not connected yet: asked again at the next renewal

    def _read(self, source: LoadSource) -> None:
        """Read what ``source`` sent (``MAX_FRAMES_PER_TURN`` at most); pass on the newest load update among it."""
        newest, read = None, 0
        while read < MAX_FRAMES_PER_TURN:
            try:
                frames = source.sock.recv_multipart(_NOBLOCK)
            except zmq.Again:
                break
            read += 1
            if len(frames) == 4 and frames[1] == LOAD_TAG:
                if newest is not None:
                    source.throttled += 1
                newest = frames[3]
            elif len(frames) >= 3 and frames[-2] == END_SEQ:  # vLLM's end marker: it publishes no load
                if self.on_absent is not None and not source.absent:
                    source.absent = True
                    self.on_absent(source.name)
            else:
                source.bad_frames += 1
        # read only with a token left (``_turn``): the turn is paid after, in debt if need be, and the source waits
        source.budget.spend(read / FRAMES_PER_UPDATE + (newest is not None))
        if newest is not None:
            self._take(source, newest)

    def _take(self, source: LoadSource, payload: bytes) -> None:
        try:
            update = admit(decode_load_update(payload))
        except (msgspec.DecodeError, msgspec.ValidationError):
            source.bad_frames += 1
            return
        except ValueError as e:
            source.refused += 1
            if not source.warned:
                source.warned = True
                logger.warning("replica %s published a load update the router refuses: %s (further refusals of it "
                               "are counted, not logged: kvmesh_router_load_feed{counter=\"refused\"})",
                               source.name, e)
            return
        self.on_load(source.name, update)
        source.updates += 1
