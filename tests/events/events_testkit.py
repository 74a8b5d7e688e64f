"""Small builders shared by the events tests (ephemeral loopback ports, bounded waits)."""

from __future__ import annotations

import time

import zmq
from kvmesh.events.publisher import PublisherConfig, ZmqEventPublisher
from kvmesh.events.schema import BlockStored

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
