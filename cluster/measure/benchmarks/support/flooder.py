"""The hostile publisher of ``kvmesh bench flood``: a plain ZeroMQ PUB that sends what no replica should.

It cycles, as fast as its subscriber reads (a PUB drops what its queue cannot hold), through garbage
payloads, a message of two frames, a 3-byte seq frame, a payload over ``max_payload_bytes``, a valid
batch of ``max_batch_blocks`` 16-token blocks (~6 MB), valid msgpack naming more blocks than a batch
may, and valid batches claiming the benchmark client's prefixes ("route them to me"); every 5 s one
message over ZeroMQ's MAXMSGSIZE (the subscriber's ZeroMQ drops the connection, which comes back).
``mix="valid"`` sends only valid batches of ``max_batch_blocks`` blocks, in seq order; ``mix="endless"``
is no ZeroMQ socket at all but raw ZMTP, one multipart message that never ends. ``mix="hostile"`` sends
the frames that are expensive to decode: arrays nested where events belong, batches of 200,000
events (map and positional forms), valid batches of ``max_batch_blocks`` blocks, and has a replay socket
that answers every replay or snapshot request with snapshot frames that cannot be decoded.
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
    if mix == "hostile":
        return hostile_cycle(batch(cfg.max_batch_blocks)), None
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


HOSTILE_EVENTS = 200_000
"""Events in each of ``mix="hostile"``'s big batches (batches of 200,000 events)."""


def hostile_cycle(huge_batch: bytes) -> list[list[bytes]]:
    """``mix="hostile"``'s payloads: each costs a full decode ~0.2-1.5 s and up to ~300 MB of Python
    objects (measured on stories-size hosts) unless refused by its shape first."""
    import msgspec

    enc = msgspec.msgpack.Encoder()
    lists = 2_000_000
    nested = b"\x93\xcb" + b"\0" * 8 + b"\xdd" + lists.to_bytes(4, "big") + b"\x91\x90" * lists + b"\x00"
    deep = b"\x93\xcb" + b"\0" * 8 + b"\x91" * 1_000_000 + b"\x90" + b"\x00"
    removed = [["BlockRemoved", [b"\0" * 7 + b"\1"], "GPU"]] * HOSTILE_EVENTS  # positional form, bytes hashes
    cleared = [{"type": "AllBlocksCleared"}] * HOSTILE_EVENTS
    hashes_of_lists = [{"type": "BlockRemoved", "block_hashes": [[]] * lists, "medium": "GPU"}]
    return [[nested], [deep], [enc.encode([time.time(), removed, 0])], [enc.encode([time.time(), cleared, 0])],
            [enc.encode([time.time(), hashes_of_lists, 0])], [huge_batch]]


def undecodable_snapshot_server(stop) -> tuple[str, object]:
    """``mix="hostile"``'s replay socket: answers any request with two snapshot chunks that are not
    batches (4 MB of arrays nested where events belong), then the end. Returns its address and thread."""
    import threading

    import zmq
    from kvmesh.events.wire import SNAPSHOT_TAG

    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    chunk = b"\x93\xcb" + b"\0" * 8 + b"\xdd" + (2_000_000).to_bytes(4, "big") + b"\x91\x90" * 2_000_000 + b"\x00"

    def serve() -> None:
        while not stop.is_set():
            if not router.poll(200):
                continue
            peer = router.recv_multipart()[0]
            seq = (1 << 40).to_bytes(8, "big")
            try:
                for payload in (chunk, chunk, b""):
                    router.send_multipart([peer, b"", SNAPSHOT_TAG, seq, payload], zmq.NOBLOCK)
            except zmq.Again:
                pass
        router.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return f"tcp://127.0.0.1:{port}", thread


ZMTP_GREETING = b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0") + b"\0" * 32
"""ZMTP 3.0 greeting of a NULL-mechanism peer (as a server)."""


def zmtp_ready(socket_type: bytes) -> bytes:
    """The READY command of a ZMTP peer of ``socket_type`` (b"PUB", b"ROUTER", ...)."""
    body = b"\x05READY" + b"\x0bSocket-Type" + len(socket_type).to_bytes(4, "big") + socket_type
    return b"\x04" + bytes([len(body)]) + body
ENDLESS_FRAME = b"\x03" + (60_000).to_bytes(8, "big") + b"x" * 60_000
"""A 60 kB frame flagged MORE: a message that a stream of these never ends."""


def endless_message_peer(go, stop, socket_type: bytes = b"PUB") -> tuple[str, object]:
    """``mix="endless"``: a raw-ZMTP "publisher" (no ZeroMQ) streaming one multipart message that never
    ends, which ZeroMQ's receiving side holds whole; accepts reconnections. ``socket_type`` b"ROUTER"
    makes it a replay socket that answers so. Returns its address and the
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
                conn.settimeout(5)
                conn.sendall(ZMTP_GREETING + zmtp_ready(socket_type))
                got = b""
                while len(got) < len(ZMTP_GREETING) + 2:  # the peer's greeting and its READY's header:
                    got += conn.recv(4096)                 # frames sent before them fail its handshake
                conn.settimeout(None)
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
        endpoint_q.put((endpoint, None))
        thread.join()
        counts_q.put({})
        return
    cycle, too_big = _frames(prefixes(), mix)
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    replay = undecodable_snapshot_server(stop)[0] if mix == "hostile" else None
    endpoint_q.put((f"tcp://127.0.0.1:{port}", replay))
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
