"""A router's load feed against hand-driven replica sockets: any update, well formed or hostile, reaches the router's
real intake (events/subscribe/load_feed.py, router/control/published_loads.py) and its event loop."""

from __future__ import annotations

import asyncio
import threading
import time

import zmq
from kvmesh.events.config import SubscriberConfig
from kvmesh.events.load import ReplicaLoadUpdate, encode_load_update
from kvmesh.events.wire import LOAD_REQUEST, LOAD_TAG, pack_seq
from kvmesh.router.control.published_loads import PublishedLoads
from kvmesh.router.replicas.spec import ReplicaSpec
from kvmesh.router.routing.kv_router import KVRouter

EPOCH = 7


def update(seq: int, running: int = 0, epoch: int = EPOCH, **kw) -> ReplicaLoadUpdate:
    """An honest-looking update of ``running`` requests (``kw`` overrides any field)."""
    fields = dict(ts=time.time(), seq=seq, num_running=running, num_waiting=0, queued_prefill_tokens=0, kv_usage=0.1,
                  accepted={}, epoch=epoch)
    fields.update(kw)
    return ReplicaLoadUpdate(**fields)


class FakeLoadSource:
    """A replica's replay socket that answers load requests with what the test sends (test thread only)."""

    def __init__(self) -> None:
        self.sock = zmq.Context.instance().socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, 0)
        self.endpoint = f"tcp://127.0.0.1:{self.sock.bind_to_random_port('tcp://127.0.0.1')}"
        self.askers: set[bytes] = set()

    def take_requests(self) -> bool:
        while self.sock.poll(0):
            identity, _, request = self.sock.recv_multipart()
            if request.startswith(LOAD_REQUEST):
                self.askers.add(identity)
        return bool(self.askers)

    def send(self, payload: bytes | ReplicaLoadUpdate) -> None:
        if isinstance(payload, ReplicaLoadUpdate):
            payload = encode_load_update(payload)
        for identity in self.askers:
            self.sock.send_multipart((identity, b"", LOAD_TAG, pack_seq(0), payload))

    def close(self) -> None:
        self.sock.close(linger=0)


class Fleet:
    """A ``KVRouter`` of ``n`` replicas r0..r{n-1}, each a ``FakeLoadSource``, its load feed on a loop thread."""

    def __init__(self, n: int = 3) -> None:
        self.router = KVRouter()
        self.sources = {f"r{i}": FakeLoadSource() for i in range(n)}
        for rid, source in self.sources.items():
            self.router.add_replica(rid, spec=ReplicaSpec(url="http://127.0.0.1:9", replay=source.endpoint))
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.loads = self.on_loop(lambda: PublishedLoads(self.router, SubscriberConfig(), self.loop))
        deadline = time.monotonic() + 10
        while not all(s.take_requests() for s in self.sources.values()):
            assert time.monotonic() < deadline, "the feed never asked every replica for its load"
            time.sleep(0.01)

    def on_loop(self, fn):
        """``fn()`` run on the router's loop (after everything scheduled there before)."""
        async def call():
            return fn()
        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(timeout=10)

    def seen(self) -> int:
        """Frames the feed has read so far, whatever it made of them."""
        feed = self.loads.feed
        return sum(getattr(feed, name, 0) for name in ("updates", "bad_frames", "refused", "throttled"))

    def send(self, rid: str, *updates: ReplicaLoadUpdate | bytes) -> None:
        """Send ``updates`` from ``rid`` and wait until the router's loop has taken them (or refused them)."""
        before = self.seen()
        for u in updates:
            self.sources[rid].send(u)
        deadline = time.monotonic() + 10
        while self.seen() < before + len(updates):
            assert time.monotonic() < deadline, "the feed never read the updates"
            time.sleep(0.005)
        time.sleep(0.02)
        self.on_loop(lambda: None)
        self.on_loop(lambda: None)

    def load(self, rid: str):
        return self.router.replicas.get(rid).load

    def choice(self) -> str:
        """Where an uncached prompt goes now."""
        return self.on_loop(lambda: self.router.route(list(range(64)), commit=False).replica.id)

    def close(self) -> None:
        self.on_loop(self.loads.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        for source in self.sources.values():
            source.close()
