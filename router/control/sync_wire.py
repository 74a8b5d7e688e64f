"""What routers tell each other of their choices (router/control/router_sync.py), on the wire and at intake.

One frame per message, msgpack of ``RouterChoices`` (arrays, as vLLM's event batches)::

    RouterChoices [router_id, seq, key_check, [RouterChoice [replica_id, booking, uncached_tokens, keys, hold], ...]]

``booking`` is the number the sending router gave the request on that replica (router/replicas/bookings.py; 0: the
replica publishes no load, so none was given), ``uncached_tokens`` what it counts as the request's prefill there,
``keys`` the router keys of the prompt's blocks (router/routing/keys.py), which it credited to that replica
(router/routing/predictions.py). ``hold`` (not 0) numbers a prediction the sending router holds until the replica's
first bytes (``RouterConfig.predict_hold_s``): the others hold those keys too, and a later choice with the same
``hold`` and no keys releases them (router/routing/peer_holds.py); a router of a version without ``hold`` reads the
rest of the choice and ignores it (msgspec drops trailing array items a struct does not have). Routers that sync
derive their key seed from the cluster's internal key (``key_seed``), so a key means the same block to each;
``key_check`` names the seed without revealing it, and a router whose seed differs uses the bookings and not the keys.

``check`` refuses what no honest router sends (a ValueError naming the field): numbers out of range, more choices
or keys than one request can carry, an empty id. What it passes can still lie, within bounds: a booking lasts until
the replica's published load acknowledges it or ``BOOKING_MAX_AGE_S``, a prediction ``predict_ttl_s``, a held one
the receiving router's ``predict_hold_s``.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

import msgspec

__all__ = ["MAX_CHOICES_PER_FRAME", "MAX_SYNC_FRAME_BYTES", "SYNC_CONTEXT_TOKENS", "TOPIC", "RouterChoice",
           "RouterChoices", "check", "decode_choices", "encode_choices", "key_check", "key_seed", "router_key_seed"]

TOPIC = b"kvmesh-choices"
"""First frame of every message (a subscriber filters on it)."""
MAX_CHOICES_PER_FRAME = 64
"""Choices one frame may carry (a router sends each at once, or the few of one turn of its loop)."""
MAX_SYNC_FRAME_BYTES = 1 << 21
"""Largest frame a subscriber accepts (ZeroMQ drops bigger): 64 choices of 4k keys each."""
MAX_ID_CHARS = 256
"""Longest router or replica id taken."""
MAX_TOKENS = 1 << 24
"""Most uncached prompt tokens one booking may count (no model takes a prompt this long)."""
SYNC_CONTEXT_TOKENS = 1 << 17
"""The longest prompt whose keys a router takes from another when it knows no context length of its own (no
``max_model_len``, no tokenizer): a longer key list is refused."""
_MAX_KEY = (1 << 64) - 1
_MAX_BOOKING = (1 << 53) - 1


class RouterChoice(msgspec.Struct, array_like=True, frozen=True):
    """One request a router sent to a replica, or (``hold`` without ``keys``) the release of a held one."""

    replica_id: str
    booking: int
    uncached_tokens: int
    keys: list[int]
    hold: int = 0
    """The sending router's number of this held prediction (0: a plain one)."""


class RouterChoices(msgspec.Struct, array_like=True, frozen=True):
    """One frame: a router's choices since its last frame, numbered by ``seq`` (from 1 in each process)."""

    router_id: str
    seq: int
    key_check: int
    choices: list[RouterChoice]


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(RouterChoices)


def encode_choices(message: RouterChoices) -> bytes:
    return _encoder.encode(message)


def decode_choices(payload: bytes) -> RouterChoices:
    """The message in ``payload`` (msgspec.DecodeError / ValidationError when it is none)."""
    return _decoder.decode(payload)


def check(message: RouterChoices, max_keys: int) -> RouterChoices:
    """``message`` when every field is in range (``max_keys``: the most blocks a prompt has); ValueError otherwise."""
    if not 0 < len(message.router_id) <= MAX_ID_CHARS:
        raise ValueError(f"router_id of {len(message.router_id)} characters (1 to {MAX_ID_CHARS})")
    if len(message.choices) > MAX_CHOICES_PER_FRAME:
        raise ValueError(f"{len(message.choices)} choices in one frame (at most {MAX_CHOICES_PER_FRAME})")
    for choice in message.choices:
        if not 0 < len(choice.replica_id) <= MAX_ID_CHARS:
            raise ValueError(f"replica_id of {len(choice.replica_id)} characters (1 to {MAX_ID_CHARS})")
        if not 0 <= choice.booking <= _MAX_BOOKING:
            raise ValueError(f"booking {choice.booking} out of range")
        if not 0 <= choice.hold <= _MAX_BOOKING:
            raise ValueError(f"hold {choice.hold} out of range")
        if not 0 <= choice.uncached_tokens <= MAX_TOKENS:
            raise ValueError(f"uncached_tokens {choice.uncached_tokens} out of range (0 to {MAX_TOKENS})")
        if len(choice.keys) > max_keys:
            raise ValueError(f"{len(choice.keys)} block keys (a prompt has at most {max_keys})")
        if choice.keys and not (min(choice.keys) >= 0 and max(choice.keys) <= _MAX_KEY):
            raise ValueError("a block key out of the 64-bit range")
    return message


def key_seed(internal_key: str) -> int:
    """The router key seed every router of a cluster derives from its internal key (64 bits; the key stays secret:
    a seed is what makes the index's keys unforgeable, so it is never drawn from something a tenant knows)."""
    digest = hmac.new(internal_key.encode(), b"kvmesh router key seed", hashlib.sha256).digest()
    return int.from_bytes(digest[:8], "little")


def router_key_seed(internal_key: str | None, synced: bool) -> int:
    """A router process's key seed: ``key_seed`` of the internal key where it syncs with others (its config requires
    the key then), else one drawn at random (its index's keys then unforgeable and its own)."""
    return key_seed(internal_key) if synced and internal_key is not None else secrets.randbits(64)


def key_check(seed: int) -> int:
    """32 bits that differ between two seeds (almost surely) and say nothing of either."""
    return int.from_bytes(hashlib.sha256(b"kvmesh key check" + seed.to_bytes(8, "little")).digest()[:4], "little")
