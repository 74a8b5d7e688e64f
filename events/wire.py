"""ZeroMQ frame layouts of the event stream, its replay protocol and kvmesh's snapshot extension.

::

    PUB                  [topic, seq u64 BE, payload]                  one message per batch
    replay request       DEALER -> ROUTER  [b"", start_seq u64 BE]     (vLLM)
    replay answer        ROUTER -> DEALER  [b"", topic, seq, payload]  per buffered batch, seq >= start
                                           [b"", b"", 0xFF*8, b""]     end marker
    snapshot request     DEALER -> ROUTER  [b"", SNAPSHOT_REQUEST]     (kvmesh; 15 bytes, never 8)
    snapshot answer      ROUTER -> DEALER  [b"", SNAPSHOT_TAG, next_seq, chunk]  per chunk of BlockStored
                                           [b"", SNAPSHOT_TAG, next_seq, b""]     end of snapshot
    snapshot refused     ROUTER -> DEALER  [b"", SNAPSHOT_TAG, 0xFF*8, b""]     busy (over the socket's
                                                                                limits): ask again later
    load request         DEALER -> ROUTER  [b"", LOAD_REQUEST]         (kvmesh; 11 bytes) the replica's load
    load update          ROUTER -> DEALER  [b"", LOAD_TAG, seq, ReplicaLoadUpdate]   the latest at once, then
                                                                each later one for the lease (events/load.py)

``next_seq`` is the seq of the first live batch that is *not* part of the snapshot: the snapshot
equals the state after applying every batch with ``seq < next_seq``. A chunk is an ordinary
``KVEventBatch`` payload holding ``BlockStored`` chains, parents before children.

Why a vLLM-style peer is never disturbed: a vLLM publisher reads any 1-frame request as a
big-endian start_seq; ``SNAPSHOT_REQUEST`` decodes to ~2^119, beyond any seq, so vLLM answers
just the end marker -- which tells a kvmesh subscriber at once that the source has no snapshots.
Snapshot answers go only to the DEALER that asked, so plain subscribers never see them.
Older vLLM releases answer replays without the topic frame (``[b"", seq, payload]``); the
subscriber reads both.
"""

from __future__ import annotations

import struct

SEQ = struct.Struct(">Q")
END_SEQ = b"\xff" * 8
"""The replay end marker's seq frame (vLLM: ``(-1).to_bytes(8, "big", signed=True)``)."""
SNAPSHOT_REQUEST = b"kvmesh:snapshot"
"""Request frame of a snapshot. Its length (15) differs from an 8-byte start_seq on purpose."""
MAX_REQUEST_BYTES = 4096
"""Largest frame a replay/snapshot socket accepts from a peer (ZeroMQ drops a peer that sends a bigger
one). A request frame is 8 bytes (start_seq) or 15 (``SNAPSHOT_REQUEST``); ZeroMQ's own handshake
commands pass the same check (a CURVE INITIATE is ~300 bytes plus metadata), hence the room."""
LOAD_REQUEST = b"kvmesh:load"
"""Request frame of a replica's load updates (events/load.py); 11 bytes, never a seq's 8."""
LOAD_TAG = b"\x00kvmesh:load"
"""Topic frame of load updates: the load's topic of its own, on the replay socket, which only askers receive."""
SNAPSHOT_TAG = b"\x00kvmesh:snapshot"
"""Topic frame of snapshot answers; starts with NUL so it cannot be a real (UTF-8 text) topic."""


def pack_seq(seq: int) -> bytes:
    """``seq`` as 8 bytes big-endian unsigned."""
    return SEQ.pack(seq)


def unpack_seq(frame: bytes) -> int:
    """Inverse of ``pack_seq``; raises ValueError unless the frame has exactly 8 bytes."""
    if len(frame) != 8:
        raise ValueError(f"seq frame must be 8 bytes, got {len(frame)}")
    return SEQ.unpack(frame)[0]
