"""A router's subscription to its replicas' published loads (events/load.py): one DEALER per replica's replay socket.

    add_source(name, replay endpoint, curve server key)     ask at once, then every ``renew_s``
    on_load(name, update)                                   each update, on this feed's thread

Its own thread and sockets, apart from the KV event feed (feed_loop.py), whose DEALERs carry one request at a time
and are replaced on a timeout: a load update may come any time. A replica that answers a load request with a
replay end marker (vLLM's answer to a request it does not know) publishes no load: ``on_absent`` says so once, and
the router keeps polling its ``/load``. An undecodable frame is counted (``bad_frames``) and dropped.
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
from kvmesh.events.wire import END_SEQ, LOAD_REQUEST, LOAD_TAG

__all__ = ["LoadFeed"]

logger = logging.getLogger(__name__)

MAX_LOAD_FRAME_BYTES = 1 << 20
"""Largest frame a load DEALER accepts (an update is ~100 bytes plus ~40 per router id; ZeroMQ drops bigger)."""
_NOBLOCK = int(zmq.NOBLOCK)
_IDLE_WAIT_S = 0.1
"""How long a feed with no source waits for one before looking at ``close`` again."""


class LoadFeed:
    """Follows the published loads of named replicas (see the module doc)."""

    def __init__(self, on_load: Callable[[str, ReplicaLoadUpdate], None],
                 on_absent: Callable[[str], None] | None = None, renew_s: float = LOAD_LEASE_S / 3,
                 curve_keypair: tuple[str, str] | None = None) -> None:
        self.on_load, self.on_absent, self.renew_s = on_load, on_absent, renew_s
        self._keypair = curve_keypair
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._dealers: dict[str, zmq.Socket] = {}
        self._owner: dict[zmq.Socket, str] = {}
        self._asked: dict[str, float] = {}
        self._absent: set[str] = set()
        self.updates = 0
        """Updates applied (all replicas)."""
        self.bad_frames = 0
        """Frames dropped: not a load update, or undecodable."""
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="kvmesh-load-feed", daemon=True)

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
                self._take_calls(poller, 0.0 if self._dealers else _IDLE_WAIT_S)
                self._renew()
                for sock, _ in poller.poll(100) if self._dealers else ():  # zmq polls no socket at once
                    self._read(sock)
        finally:
            for sock in self._dealers.values():
                sock.close(linger=0)

    def _take_calls(self, poller: zmq.Poller, wait_s: float) -> None:
        """Apply the pending ``add_source``/``remove_source`` calls, waiting up to ``wait_s`` for the first."""
        while True:
            try:
                name, endpoint, server_key = self._calls.get(timeout=wait_s) if wait_s else self._calls.get_nowait()
            except queue.Empty:
                return
            wait_s = 0.0
            old = self._dealers.pop(name, None)
            if old is not None:
                poller.unregister(old)
                del self._owner[old]
                old.close(linger=0)
            self._asked.pop(name, None)
            self._absent.discard(name)
            if endpoint is None:
                continue
            sock = self._ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.MAXMSGSIZE, MAX_LOAD_FRAME_BYTES)
            if server_key is not None:
                if self._keypair is None:
                    self._keypair = curve.generate_keypair()
                curve.make_client(sock, server_key, *self._keypair)
            sock.connect(endpoint)
            self._dealers[name], self._owner[sock] = sock, name
            poller.register(sock, zmq.POLLIN)

    def _renew(self) -> None:
        now = time.monotonic()
        for name, sock in self._dealers.items():
            if now - self._asked.get(name, -self.renew_s) >= self.renew_s:
                self._asked[name] = now
                try:
                    sock.send_multipart((b"", LOAD_REQUEST), _NOBLOCK)
                except zmq.Again:
                    pass  # not connected yet: asked again at the next renewal

    def _read(self, sock: zmq.Socket) -> None:
        name = self._owner.get(sock)
        for _ in range(64):
            try:
                frames = sock.recv_multipart(_NOBLOCK)
            except zmq.Again:
                return
            if name is None:
                continue
            if len(frames) == 4 and frames[1] == LOAD_TAG:
                try:
                    update = decode_load_update(frames[3])
                except (msgspec.DecodeError, msgspec.ValidationError):
                    self.bad_frames += 1
                    continue
                self.updates += 1
                self.on_load(name, update)
            elif len(frames) >= 3 and frames[-2] == END_SEQ:  # vLLM's end marker: it publishes no load
                if self.on_absent is not None and name not in self._absent:
                    self._absent.add(name)
                    self.on_absent(name)
            else:
                self.bad_frames += 1
