"""Small builders shared by the events tests (ephemeral loopback ports, bounded waits)."""

from __future__ import annotations

import threading
import time

import zmq
from kvmesh.events.config import PublisherConfig
from kvmesh.events.publish.publisher import ZmqEventPublisher
from kvmesh.events.schema import BlockStored
from kvmesh.events.state import CachedBlockSet
from kvmesh.events.subscribe.subscriber import EventSubscriber, wait_until

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
    return wait_until(predicate, timeout)


def raw_socket(kind: int, address: str, subscribe: bytes | None = None) -> zmq.Socket:
    sock = zmq.Context.instance().socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    if subscribe is not None:
        sock.setsockopt(zmq.SUBSCRIBE, subscribe)
    sock.connect(address)
    return sock


def raw_publisher() -> tuple[zmq.Socket, str]:
    """A hand-driven PUB bound on loopback and its address. It is an XPUB (a PUB to its peers) so that
    ``wait_subscribed`` can tell when a subscriber's subscription arrived: a PUB drops what it sends before."""
    pub = zmq.Context.instance().socket(zmq.XPUB)
    pub.setsockopt(zmq.LINGER, 0)
    return pub, f"tcp://127.0.0.1:{pub.bind_to_random_port('tcp://127.0.0.1')}"


def wait_subscribed(xpub: zmq.Socket, timeout: float = 5.0) -> bool:
    """Wait for a subscription to reach ``xpub`` (reported as ``b"\\x01" + topic``); True if one did."""
    deadline = time.monotonic() + timeout
    while xpub.poll(max(0, int((deadline - time.monotonic()) * 1000))):
        if xpub.recv()[:1] == b"\x01":
            return True
    return False


def recv_until_end(dealer: zmq.Socket, timeout_ms: int = 3000) -> list[list[bytes]]:
    """DEALER answers up to and including an end frame (empty last frame)."""
    out = []
    while dealer.poll(timeout_ms):
        frames = dealer.recv_multipart()
        out.append(frames)
        if frames[-1] == b"":
            return out
    raise AssertionError(f"no end marker after {len(out)} answers")


class RewritingSocket:
    """Wraps a PUB socket: each whole message ``[topic, seq, payload]`` is sent as ``rewrite(seq, frames)``
    returns it (None: not sent). The publisher's replay buffer keeps what it meant to send."""

    def __init__(self, sock: zmq.Socket, rewrite) -> None:
        self._sock, self._rewrite = sock, rewrite
        self._frames: list = []

    def send(self, frame, flags=0):
        self._frames.append(frame)
        if flags & zmq.SNDMORE:
            return
        frames, self._frames = self._frames, []
        frames = self._rewrite(int.from_bytes(frames[1], "big"), frames)
        if frames is not None:
            self._sock.send_multipart(frames, flags)

    def close(self, *a, **kw):
        self._sock.close(*a, **kw)


class DroppingSocket(RewritingSocket):
    """Wraps a PUB socket and silently drops the batches whose seq ``drop(seq)`` selects."""

    def __init__(self, sock: zmq.Socket, drop) -> None:
        super().__init__(sock, lambda seq, frames: None if drop(seq) else frames)


class Follower:
    """An EventSubscriber that folds what it receives into one CachedBlockSet per source."""

    def __init__(self, sources, config=None, slow_first: int = 0, delay: float = 0.0,
                 gate: threading.Event | None = None) -> None:
        self.states: dict[str, CachedBlockSet] = {s.name: CachedBlockSet() for s in sources}
        self.statuses: list[tuple[str, str]] = []
        self._slow_left, self._delay = slow_first, delay
        self._gate = gate
        """The first live batch waits until ``gate`` is set: a consumer that stops reading (``stopped``)."""
        self.stopped = threading.Event()
        """Set when the first live batch waits at ``gate``."""
        self.sub = EventSubscriber(sources, on_batch=self._on_batch, config=config,
                                   on_status=lambda n, s, d: self.statuses.append((n, s)))

    def _on_batch(self, name, seq, batch) -> None:
        if self._gate is not None and seq >= 0 and not self.stopped.is_set():
            self.stopped.set()
            self._gate.wait(10)
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
        return (pub.flushed() and st is not None and st.last_seq == pub.seq - 1
                and tracker is not None and tracker.mode == "live")

    def joined(self, name: str, pub, followers: int = 1, timeout: float = 5.0) -> bool:
        """Following ``pub`` live: its snapshot applied, the replay probe that follows a snapshot answered
        (lost batches count as gaps only after it) and the subscription arrived (a PUB drops before).
        ``followers``: how many follow ``pub`` (each probes once after its snapshot)."""
        return wait_for(lambda: pub.stats["replays"] >= followers and self.caught_up(name, pub), timeout) and \
            pub.wait_for_subscribers(followers, timeout)

    def converges(self, name: str, pub, timeout: float = 8.0) -> bool:
        """Caught up with ``pub`` and holding exactly its shadow (what it has sent)."""
        return wait_for(lambda: self.caught_up(name, pub) and self.states[name].keys() == pub._io.shadow.keys(),
                        timeout)


class OldVllmPublisher:
    """A publisher the way older vLLM releases behave: replay answers without the topic frame
    (``[b"", seq, payload]``, end ``[b"", 0xFF*8, b""]``) and no snapshots (a snapshot request
    reads as a huge start_seq). Single-threaded: call ``serve()`` to answer pending requests."""

    def __init__(self, topic: bytes = b"") -> None:
        ctx = zmq.Context.instance()
        self.pub, self.endpoint = raw_publisher()
        self.router = ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.replay_endpoint = f"tcp://127.0.0.1:{self.router.bind_to_random_port('tcp://127.0.0.1')}"
        self.topic, self.buffer, self.seq = topic, [], 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def publish(self, payload: bytes, send: bool = True) -> None:
        with self._lock:
            if send:
                self.pub.send_multipart([self.topic, self.seq.to_bytes(8, "big"), payload])
            self.buffer.append((self.seq, payload))
            self.seq += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self.router.poll(20):
                continue
            with self._lock:
                client_id, _, start = self.router.recv_multipart()
                start_seq = int.from_bytes(start, "big")
                for seq, payload in self.buffer:
                    if seq >= start_seq:
                        self.router.send_multipart([client_id, b"", seq.to_bytes(8, "big"), payload])
                self.router.send_multipart([client_id, b"", b"\xff" * 8, b""])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.pub.close()
        self.router.close()


class CorruptingSocket(RewritingSocket):
    """Wraps a PUB socket and replaces the payload of the batches whose seq ``corrupt(seq)``
    selects by ``garbage`` (the publisher's replay buffer keeps the good payload)."""

    def __init__(self, sock: zmq.Socket, corrupt, garbage: bytes) -> None:
        super().__init__(sock, lambda seq, frames: [*frames[:2], garbage] if corrupt(seq) else frames)


class RawSource:
    """A hand-driven hostile source: a PUB and a ROUTER on loopback, frames sent as given."""

    def __init__(self) -> None:
        ctx = zmq.Context.instance()
        self.pub, self.endpoint = raw_publisher()
        self.router = ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.replay_endpoint = f"tcp://127.0.0.1:{self.router.bind_to_random_port('tcp://127.0.0.1')}"

    def requests(self, timeout_ms: int = 3000) -> list[tuple[bytes, bytes]]:
        """``(identity, request)`` of every request that arrives within ``timeout_ms``."""
        out = []
        while self.router.poll(timeout_ms if not out else 0):
            frames = self.router.recv_multipart()
            out.append((frames[0], frames[-1]))
        return out

    def close(self) -> None:
        self.pub.close()
        self.router.close()


class EndlessMessagePeer:
    """A raw-ZMTP publisher streaming one multipart message that never ends (``kvmesh bench flood
    --mix endless``'s peer, in a thread); accepts reconnections. ``close()`` stops it. ``socket_type``
    b"ROUTER": a replay socket answering so."""

    def __init__(self, socket_type: bytes = b"PUB") -> None:
        from kvmesh.cluster.measure.benchmarks.support.flooder import endless_message_peer

        go, self._stop = threading.Event(), threading.Event()
        go.set()
        self.endpoint, self._thread = endless_message_peer(go, self._stop, socket_type)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
