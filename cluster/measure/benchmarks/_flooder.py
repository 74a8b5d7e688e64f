"""The hostile publisher of ``kvmesh bench flood``: a plain ZeroMQ PUB that sends what no replica should.

It cycles, as fast as its subscriber reads (a PUB drops what its queue cannot hold), through garbage
payloads, a message of two frames, a 3-byte seq frame, a payload over ``max_payload_bytes``, a valid
batch of ``max_batch_blocks`` 16-token blocks (~6 MB), valid msgpack naming more blocks than a batch
may, and valid batches claiming the benchmark client's prefixes ("route them to me"); every 5 s one
message over ZeroMQ's MAXMSGSIZE (the subscriber's ZeroMQ drops the connection, which comes back).
``mix="valid"`` sends only valid batches of ``max_batch_blocks`` blocks, in seq order; ``mix="endless"``
is no ZeroMQ socket at all but raw ZMTP, one multipart message that never ends.
"""

from __future__ import annotations

import random
import time

BLOCK_SIZE = 16
PREFIXES, PREFIX_TOKENS = 32, 64
VOCAB = 500  # stories260K has 512 token ids


def prefixes(seed: int = 23) -> list[list[int]]:
    """The benchmark client's shared prompt prefixes (token ids)."""
    rng = random.Random(seed)
    return [[rng.randrange(1, VOCAB) for _ in range(PREFIX_TOKENS)] for _ in range(PREFIXES)]


def _frames(claims: list[list[int]], mix: str) -> tuple[list[list[bytes]], list[bytes] | None]:
    """The flooder's messages (without topic and seq frames where they belong to the attack): the cycle,
    and the one over ZeroMQ's MAXMSGSIZE. ``mix="valid"``: only valid batches of ``max_batch_blocks``
    blocks, in seq order -- a source that never sends a bad frame, only too much."""
    from kvmesh.events.codec import encode_batch
    from kvmesh.events.config import SubscriberConfig
    from kvmesh.events.schema import BlockStored, KVEventBatch

    rng = random.Random(7)
    cfg = SubscriberConfig()

    def batch(n_blocks: int, tokens=None, block_size: int = BLOCK_SIZE) -> bytes:
        hashes = [rng.getrandbits(64) for _ in range(n_blocks)]
        tokens = tokens or [rng.randrange(VOCAB) for _ in range(n_blocks * block_size)]
        return encode_batch(KVEventBatch(ts=time.time(), events=[BlockStored(
            block_hashes=hashes, parent_block_hash=None, token_ids=tokens, block_size=block_size, lora_id=None,
            medium="GPU", lora_name=None)]))

    if mix == "valid":
        return [[batch(cfg.max_batch_blocks)] for _ in range(4)], None
    garbage = rng.randbytes(4096)
    cycle = [
        [garbage], [garbage], [garbage], [garbage],
        ["short"], ["badseq", garbage],                               # wrong frame count, 3-byte seq frame
        [rng.randbytes(cfg.max_payload_bytes + (4 << 20))],           # over max_payload_bytes, under MAXMSGSIZE
        [batch(cfg.max_batch_blocks)],                                # valid but huge: 65,536 blocks, ~6 MB
        [batch(cfg.max_batch_blocks + 1, block_size=1)],              # valid msgpack naming too many blocks
        *[[batch(PREFIX_TOKENS // BLOCK_SIZE, tokens=list(p))] for p in claims[:8]],  # "I hold your prefixes"
    ]
    return cycle, [b"", b"\0" * 8, b"\0" * (cfg.max_message_bytes + 1)]


ZMTP_GREETING = b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0") + b"\0" * 32
"""ZMTP 3.0 greeting of a NULL-mechanism peer (as a server)."""
_READY = b"\x05READY" + b"\x0bSocket-Type" + (3).to_bytes(4, "big") + b"PUB"
ZMTP_READY_PUB = b"\x04" + bytes([len(_READY)]) + _READY
"""The READY command of a PUB socket."""
ENDLESS_FRAME = b"\x03" + (60_000).to_bytes(8, "big") + b"x" * 60_000
"""A 60 kB frame flagged MORE: a message that a stream of these never ends."""


def endless_message_peer(go, stop) -> tuple[str, object]:
    """``mix="endless"``: a raw-ZMTP "publisher" (no ZeroMQ) streaming one multipart message that never
    ends, which ZeroMQ's receiving side holds whole; accepts reconnections. Returns its address and the
    thread serving it (starts sending once ``go`` is set)."""
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    srv.settimeout(0.2)

    def serve() -> None:
        chunk = ENDLESS_FRAME * 16
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            try:
                conn.sendall(ZMTP_GREETING + ZMTP_READY_PUB)
                go.wait()
                while not stop.is_set():
                    conn.sendall(chunk)
            except OSError:
                pass  # cut off: wait for the subscriber to come back
            finally:
                conn.close()
        srv.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return f"tcp://127.0.0.1:{srv.getsockname()[1]}", thread


def hostile_publisher(endpoint_q, go, stop, counts_q, mix: str = "all") -> None:
    """The hostile publisher: binds a plain PUB, waits for ``go``, floods until ``stop``."""
    import zmq

    if mix == "endless":
        endpoint, thread = endless_message_peer(go, stop)
        endpoint_q.put(endpoint)
        thread.join()
        counts_q.put({})
        return
    cycle, too_big = _frames(prefixes(), mix)
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    endpoint_q.put(f"tcp://127.0.0.1:{port}")
    go.wait()
    sent = dropped = 0
    seq, last_big = 0, time.monotonic()
    while not stop.is_set():
        for msg in cycle:
            seq += 1
            if msg[0] == "short":
                frames = [b"", seq.to_bytes(8, "big")]
            elif msg[0] == "badseq":
                frames = [b"", b"abc", msg[1]]
            else:
                frames = [b"", seq.to_bytes(8, "big"), msg[0]]
            try:
                pub.send_multipart(frames, zmq.NOBLOCK, copy=False)
                sent += 1
            except zmq.Again:
                dropped += 1
        if too_big is not None and time.monotonic() - last_big > 5:
            last_big = time.monotonic()
            try:
                pub.send_multipart(too_big, zmq.NOBLOCK, copy=False)
            except zmq.Again:
                pass
        time.sleep(0)  # let go of the core for a moment; the router reads slower than this sends anyway
    counts_q.put({"attempted": sent, "refused_at_publisher": dropped})
    pub.close()
    ctx.term()
