"""Encode and decode event batches: strict vLLM 0.33 bytes out, every known vLLM dialect in.

``encode_batch`` writes exactly what vLLM writes (see ``schema.py`` and its golden vector).
``decode_batch`` takes the fast typed path first and falls back to a lenient one that also reads:

- events as positional arrays with the tag first (``["BlockStored", hashes, parent, ...]``,
  the encoding of vLLM releases before the map form);
- block hashes as raw digest bytes instead of u64 ints (converted to the low 64 bits, vLLM's
  ``ExternalBlockHash`` convention);
- unknown map keys (ignored) and unknown event types (dropped and counted, so a newer engine's
  new event kinds do not cost the whole batch).

A payload that is not a batch at all raises ``DecodeError`` -- and nothing else: whatever the bytes
(invalid UTF-8 in a string, msgpack nested thousands deep, wrong types, huge ints), the decoder
turns the failure into ``DecodeError``, so one bad frame can never kill the thread that reads it.
``check_batch`` then applies a consumer's size limits and the schema's own invariants. The lenient path
builds whatever it reads, so it reads only what is shaped like a batch (``peek.check_shape``); the typed
path's cost is bounded by its types, and a consumer peeks at a payload before either (``peek.peek_batch``,
frame_guard.py).
"""

from __future__ import annotations

from typing import TypeAlias

import msgspec
from kvmesh.events.config import SubscriberConfig
from kvmesh.events.peek import ShapeError, check_shape
from kvmesh.events.schema import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent, KVEventBatch

_U64_MASK = (1 << 64) - 1
Msgpack: TypeAlias = None | bool | int | float | str | bytes | list["Msgpack"] | dict["Msgpack", "Msgpack"]
"""Whatever an untyped msgpack decode returns (the lenient path reads a payload this way first)."""

_ENCODER = msgspec.msgpack.Encoder()
_TYPED_DECODER = msgspec.msgpack.Decoder(KVEventBatch)
_ANY_DECODER = msgspec.msgpack.Decoder()

EVENT_TYPES: dict[str, type[KVEvent]] = {
    "BlockStored": BlockStored,
    "BlockRemoved": BlockRemoved,
    "AllBlocksCleared": AllBlocksCleared,
}
# Field order of each event type = the order of the legacy positional encoding.
_FIELDS = {name: cls.__struct_fields__ for name, cls in EVENT_TYPES.items()}


class DecodeError(ValueError):
    """The payload is not a KV event batch in any encoding we know (or breaks a limit)."""


# Everything msgspec and the lenient conversion can raise on hostile bytes: invalid UTF-8 in a
# string (UnicodeDecodeError), deep nesting (RecursionError), unhashable map keys (TypeError),
# out-of-range numbers (OverflowError), ValueError from a Struct's __post_init__.
_DECODE_FAILURES = (msgspec.MsgspecError, UnicodeDecodeError, RecursionError, ValueError, TypeError,
                    OverflowError, KeyError, IndexError, AttributeError)


class DecodedBatch(msgspec.Struct, gc=False):
    """A decoded batch plus what the lenient path had to leave out."""

    batch: KVEventBatch
    """The batch, with every hash as an unsigned 64-bit int."""
    unknown_events: int = 0
    """Events of an unknown type (or unreadable) that were dropped from the batch."""


def encode_batch(batch: KVEventBatch) -> bytes:
    """The msgpack payload vLLM would send for ``batch``."""
    return _ENCODER.encode(batch)


def external_hash_from_bytes(digest: bytes) -> int:
    """vLLM's int form of a digest-bytes hash: the low 64 bits, big-endian, unsigned."""
    return int.from_bytes(digest, "big") & _U64_MASK


def _as_int(h: Msgpack) -> Msgpack:
    return external_hash_from_bytes(h) if isinstance(h, bytes) else h


def _normalize_hashes(fields: dict[str, Msgpack]) -> None:
    """Bytes hashes of a raw event's fields -> ints, before conversion to the int-typed schema."""
    hashes = fields.get("block_hashes")
    if isinstance(hashes, (list, tuple)):
        fields["block_hashes"] = [_as_int(h) for h in hashes]
    parent = fields.get("parent_block_hash")
    if isinstance(parent, bytes):
        fields["parent_block_hash"] = external_hash_from_bytes(parent)


def decode_batch(payload: bytes) -> KVEventBatch:
    """Decode a payload leniently; raises ``DecodeError`` if it is not a batch."""
    return decode_batch_counted(payload).batch


def decode_batch_counted(payload: bytes, max_events: int = SubscriberConfig.max_batch_events,
                         max_blocks: int = SubscriberConfig.max_batch_blocks) -> DecodedBatch:
    """Like ``decode_batch`` but also reports how many unknown events were dropped. A payload the lenient
    path would read must be shaped like a batch of at most ``max_events`` events (peek.py)."""
    try:
        return DecodedBatch(_TYPED_DECODER.decode(payload))  # hashes as bytes take the lenient path
    except DecodeError:
        raise
    except _DECODE_FAILURES:
        pass
    try:
        check_shape(payload, max_events, max_blocks)
        return _decode_lenient(payload)
    except ShapeError as e:
        raise DecodeError(f"payload refused by its shape: {e}") from None
    except DecodeError:
        raise
    except _DECODE_FAILURES as e:
        raise DecodeError(f"payload is not a KV event batch ({type(e).__name__}: {str(e)[:80]})") from None


def check_batch(batch: KVEventBatch, max_blocks: int) -> int:
    """Raise ``DecodeError`` unless every BlockStored of ``batch`` carries ``block_size *
    len(block_hashes)`` token ids and the batch names at most ``max_blocks`` blocks. Returns the
    number of blocks it stores. (On the subscriber's hot path: ~0.2 us per event.)"""
    stored = named = 0
    for event in batch.events:
        if isinstance(event, BlockStored):
            n = len(event.block_hashes)
            if len(event.token_ids) != event.block_size * n:
                raise DecodeError(f"BlockStored has {len(event.token_ids)} token ids for {n} blocks of "
                                  f"{event.block_size}; expected {event.block_size * n}")
            stored += n
            named += n
        elif isinstance(event, BlockRemoved):
            named += len(event.block_hashes)
    if named > max_blocks:
        raise DecodeError(f"batch names {named} blocks; the per-batch limit is {max_blocks}")
    return stored


def _decode_lenient(payload: bytes) -> DecodedBatch:
    try:
        raw = _ANY_DECODER.decode(payload)
    except _DECODE_FAILURES as e:
        raise DecodeError(f"payload is not msgpack ({type(e).__name__}: {str(e)[:80]}); "
                          "expected [ts, events, dp_rank]") from None
    if not isinstance(raw, (list, tuple)) or len(raw) < 2 or not isinstance(raw[1], (list, tuple)):
        raise DecodeError(f"payload is not a batch [ts, events, dp_rank]: got {type(raw).__name__}")
    ts, raw_events = raw[0], raw[1]
    dp_rank = raw[2] if len(raw) > 2 else None
    if not isinstance(ts, (int, float)) or not (dp_rank is None or isinstance(dp_rank, int)):
        raise DecodeError(f"batch header has ts={ts!r}, data_parallel_rank={dp_rank!r}")
    events: list[KVEvent] = []
    unknown = 0
    for raw_event in raw_events:
        event = _convert_event(raw_event)
        if event is None:
            unknown += 1
        else:
            events.append(event)
    return DecodedBatch(KVEventBatch(ts=float(ts), events=events, data_parallel_rank=dp_rank), unknown)


def _convert_event(raw: Msgpack) -> KVEvent | None:
    """One event from its map or positional form; None if its type is unknown or it is malformed."""
    if isinstance(raw, dict):
        name = raw.get("type")
        fields = {k: v for k, v in raw.items() if k != "type" and isinstance(k, str)}
    elif isinstance(raw, (list, tuple)) and raw and isinstance(raw[0], str):
        name = raw[0]
        names = _FIELDS.get(name, ())
        fields = dict(zip(names, raw[1:], strict=False))
    else:
        return None
    cls = EVENT_TYPES.get(name) if isinstance(name, str) else None
    if cls is None:
        return None
    # Older encodings lack trailing fields that the current schema writes always (medium,
    # lora_name): they meant "unset".
    for field_name in cls.__struct_fields__:
        fields.setdefault(field_name, None)
    try:
        _normalize_hashes(fields)
        return msgspec.convert(fields, cls, strict=False)
    except _DECODE_FAILURES:
        return None
