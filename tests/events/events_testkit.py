"""Small builders shared by the events tests (ephemeral loopback ports, bounded waits)."""

from __future__ import annotations

import time

import zmq
from kvmesh.events.publisher import PublisherConfig, ZmqEventPublisher
from kvmesh.events.schema import BlockStored
from kvmesh.events.state import CachedBlockSet
from kvmesh.events.subscriber import EventSubscriber

LOOPBACK = "tcp://127.0.0.1:0"


def stored(h: int, parent: int | None, bs: int = 2) -> BlockStored:
    return BlockStored(block_hashes=[h], parent_block_hash=parent, token_ids=[h % 50] * bs, block_size=bs,
                       lora_id=None, medium="CPU", lora_name=None)


def make_publisher(**kw) -> ZmqEventPublisher:
    kw.setdefault("endpoint", LOOPBACK)
    kw.setdefault("replay_endpoint", LOOPBACK)
    snapshot_source = kw.pop("snapshot_source", None)
    return ZmqEventPublisher(PublisherConfig(**kw), snapshot_source=snapshot_source)


def wait_for(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return predicate()


def raw_socket(kind: int, address: str, subscribe: bytes | None = None) -> zmq.Socket:
    sock = zmq.Context.instance().socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    if subscribe is not None:
        sock.setsockopt(zmq.SUBSCRIBE, subscribe)
    sock.connect(address)
    return sock


def recv_until_end(dealer: zmq.Socket, timeout_ms: int = 3000) -> list[list[bytes]]:
    """DEALER answers up to and including an end frame (empty last frame)."""
    out = []
    while dealer.poll(timeout_ms):
        frames = dealer.recv_multipart()
        out.append(frames)
        if frames[-1] == b"":
            return out
    raise AssertionError(f"no end marker after {len(out)} answers")


class DroppingSocket:
    """Wraps a PUB socket and silently drops the batches whose seq ``drop(seq)`` selects."""

    def __init__(self, sock: zmq.Socket, drop) -> None:
        self._sock, self._drop = sock, drop

    def send_multipart(self, frames, flags=0):
        if self._drop(int.from_bytes(frames[1], "big")):
            return
        self._sock.send_multipart(frames, flags)

    def close(self, *a, **kw):
        self._sock.close(*a, **kw)


class Follower:
    """An EventSubscriber that folds what it receives into one CachedBlockSet per source."""

    def __init__(self, sources, config=None, slow_first: int = 0, delay: float = 0.0) -> None:
        self.states: dict[str, CachedBlockSet] = {s.name: CachedBlockSet() for s in sources}
        self.statuses: list[tuple[str, str]] = []
        self._slow_left, self._delay = slow_first, delay
        self.sub = EventSubscriber(sources, on_batch=self._on_batch, config=config,
                                   on_status=lambda n, s, d: self.statuses.append((n, s)))

    def _on_batch(self, name, seq, batch) -> None:
        if self._slow_left > 0:
            self._slow_left -= 1
            time.sleep(self._delay)
        self.states.setdefault(name, CachedBlockSet())
        self.states[name].apply_all(batch.events)

    def start(self) -> Follower:
        self.sub.start()
        return self

    def close(self) -> None:
        self.sub.close()

    def caught_up(self, name: str, pub) -> bool:
        st = self.sub.stats.get(name)
        tracker = self.sub._io.trackers.get(name)
        return pub.flushed() and st is not None and st.last_seq == pub.seq - 1 and tracker is not None and tracker.mode == "live"

    def converges(self, name: str, pub, timeout: float = 8.0) -> bool:
        """Caught up with ``pub`` and holding exactly its shadow (what it has sent)."""
        return wait_for(lambda: self.caught_up(name, pub) and self.states[name].keys() == pub._io.shadow.keys(),
                        timeout)
