"""Chained block hashing: ``hash_i = xxh3_128(parent_i, extra_keys_i, tokens_i)``.

Only full blocks get a hash. The first block's parent is ``NONE_HASH = H(seed)``, where the seed
is a per-cluster secret: xxhash is not collision resistant, so whoever knows the seed could craft
colliding prompts and read another tenant's cache. The seed is never logged nor sent in events.

The hashed bytes are a canonical, unambiguous encoding (no pickle)::

    +----------------+--------------------+-------------------+--------------------------+
    | parent digest  | len(extra) as u32  | extra-key bytes   | token ids, u32 LE each   |
    | 16 bytes       | little endian      | (see _encode_key) | (the rest of the buffer) |
    +----------------+--------------------+-------------------+--------------------------+

The parent has a fixed width and the extra keys are length-prefixed, so the token ids are exactly
the rest of the message. Token ids are packed with ``array('I')`` in one C call per extension,
which also rejects negative ids and ids above 2**32 - 1 for free.

A ``cache_salt`` enters block 0's extra keys as a *keyed* digest, ``HMAC-SHA256(salt secret,
salt)``, because events carry extra keys: an unkeyed digest would let anyone who reads the stream
confirm a guessed salt offline. The salt secret is derived one-way from the cluster's hash seed
(``cache_salt_secret``), so a router can be given it -- to key salted requests as the replicas
do -- without ever holding the seed.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct
import sys
from array import array
from collections.abc import Sequence

from xxhash import xxh3_128_digest

BlockHash = bytes
"""A 16-byte xxh3_128 digest (big-endian canonical form); internal to a replica."""

_U32 = struct.Struct("<I")
_NO_EXTRA = _U32.pack(0)
_BIG_ENDIAN_HOST = sys.byteorder == "big"
_NONE_HASH_DOMAIN = b"kvmesh/none-hash/v1\x00"
_SALT_DOMAIN = b"kvmesh/cache-salt/v1\x00"
_SALT_SECRET_DOMAIN = b"kvmesh/cache-salt-secret/v1\x00"
_SALT_CHECK_DOMAIN = b"kvmesh/cache-salt-check/v1\x00"


def generate_seed() -> bytes:
    """A fresh secret hash seed (32 random bytes); generate one per cluster, never log it."""
    return secrets.token_bytes(32)


def make_none_hash(seed: bytes | str) -> BlockHash:
    """``NONE_HASH = H(seed)``: the parent of every request's first block."""
    if isinstance(seed, str):
        seed = seed.encode()
    if not isinstance(seed, bytes | bytearray) or not seed:
        raise ValueError("hash seed must be non-empty bytes or str (use generate_seed())")
    return xxh3_128_digest(_NONE_HASH_DOMAIN + bytes(seed))


def external_hash(h: BlockHash) -> int:
    """The hash events carry: the digest's low 64 bits as an unsigned int (vLLM's convention)."""
    return int.from_bytes(h[8:], "big")


def salt_secret_from_none_hash(none_hash: BlockHash) -> bytes:
    """The key of the cache-salt digests of the cluster whose ``NONE_HASH`` this is."""
    return hashlib.sha256(_SALT_SECRET_DOMAIN + none_hash).digest()


def cache_salt_secret(seed: bytes | str) -> bytes:
    """The key of a cluster's cache-salt digests, from its hash seed (one-way: it reveals neither
    the seed nor NONE_HASH). SECRET: give it to the cluster's routers, never log it."""
    return salt_secret_from_none_hash(make_none_hash(seed))


SALT_SECRET_BYTES = hashlib.sha256().digest_size
"""Length of a cluster's salt secret (``cache_salt_secret``)."""


def check_salt_secret(secret: bytes | None) -> None:
    """ValueError unless ``secret`` is None or a salt secret's length, saying the form a router is given it in."""
    if secret is not None and len(secret) != SALT_SECRET_BYTES:
        raise ValueError(
            f"router.cache_salt_secret must be the cluster's {SALT_SECRET_BYTES}-byte salt secret, got {len(secret)} "
            f"bytes: give it as {2 * SALT_SECRET_BYTES} hex characters (in a config file or "
            "KVMESH_ROUTER_CACHE_SALT_SECRET), as the cluster record's router_secrets.cache_salt_secret holds it")


def salt_secret_check(salt_secret: bytes | None) -> str | None:
    """A short digest that shows whether two parties hold the same salt secret and reveals nothing of it (a replica
    reports its own in ``/server_info``, a router compares its own with it); None for no secret."""
    if salt_secret is None:
        return None
    return hmac.new(salt_secret, _SALT_CHECK_DOMAIN, hashlib.sha256).hexdigest()[:16]


def salt_key(cache_salt: str, salt_secret: bytes | None = None) -> str:
    """Digest of a cache salt, block 0's extra key (events never show the salt itself): keyed with
    the cluster's salt secret, so it cannot be matched against guesses without that secret.
    Without a secret (a router not given one) the digest is unkeyed and matches no replica's."""
    message = _SALT_DOMAIN + cache_salt.encode()
    if salt_secret is None:
        return hashlib.sha256(message).hexdigest()[:32]
    return hmac.new(salt_secret, message, hashlib.sha256).hexdigest()[:32]


def lora_extra_keys(lora_name: str | None, lora_identity: str | None = None) -> tuple:
    """An adapter's part of every block's extra keys: its name (vLLM's), then the identity of its weights (a digest
    the engine takes when it reads them), so a name loaded again from other weights never matches the old blocks."""
    if lora_name is None:
        return ()
    return (lora_name,) if lora_identity is None else (lora_name, lora_identity)


def block_extra_keys(block_index: int, cache_salt: str | None, lora_name: str | None,
                     salt_secret: bytes | None = None, lora_identity: str | None = None) -> tuple | None:
    """Extra hash keys of block ``block_index`` in vLLM's order: the LoRA adapter's keys on every block
    (``lora_extra_keys``), then the salt key on block 0 (vLLM's ``lora_extra_keys + mm_extra_keys +
    cache_salt_keys``; kvmesh has no multimodal keys)."""
    keys = lora_extra_keys(lora_name, lora_identity)
    if block_index == 0 and cache_salt is not None:
        keys += (salt_key(cache_salt, salt_secret),)
    return keys or None


def _encode_key(key: object, out: bytearray) -> None:
    """Appends one extra key as ``tag, u32 length, payload`` (tuples recurse)."""
    if isinstance(key, str):
        payload, tag = key.encode(), b"s"
    elif isinstance(key, bytes | bytearray):
        payload, tag = bytes(key), b"b"
    elif isinstance(key, bool) or key is None:
        payload, tag = repr(key).encode(), b"c"
    elif isinstance(key, int):
        payload, tag = str(key).encode(), b"i"
    elif isinstance(key, tuple | list):
        inner = bytearray()
        for item in key:
            _encode_key(item, inner)
        payload, tag = bytes(inner), b"t"
    else:
        raise ValueError(f"extra hash key {key!r} has type {type(key).__name__}; use str, bytes, int or tuple")
    out += tag
    out += _U32.pack(len(payload))
    out += payload


def encode_extra_keys(extra_keys: tuple | None) -> bytes:
    """The length-prefixed extra-key field of the hashed message (4 zero bytes when None)."""
    if not extra_keys:
        return _NO_EXTRA
    body = bytearray()
    for key in extra_keys:
        _encode_key(key, body)
    return _U32.pack(len(body)) + bytes(body)


def pack_token_ids(token_ids: Sequence[int]) -> bytes:
    """Token ids as little-endian u32; ValueError on a negative or too large id."""
    try:
        packed = array("I", token_ids)
    except OverflowError:
        bad = next(t for t in token_ids if not 0 <= t < 2**32)
        raise ValueError(f"token id {bad} is out of range: token ids must be in [0, 2**32)") from None
    if _BIG_ENDIAN_HOST:
        packed.byteswap()
    return packed.tobytes()


def hash_block_tokens(parent: BlockHash, token_ids: Sequence[int], extra_keys: tuple | None) -> BlockHash:
    """The hash of one block given its parent's hash, its token ids and its extra keys."""
    return xxh3_128_digest(parent + encode_extra_keys(extra_keys) + pack_token_ids(token_ids))


class RequestBlockHasher:
    """Hashes a request's full blocks incrementally: prefill fills many, decode one token at a time."""

    __slots__ = ("block_size", "none_hash", "block_hashes", "_first_extra", "_rest_extra", "_rest_keys",
                 "_first_keys")

    def __init__(self, block_size: int, none_hash: BlockHash, cache_salt: str | None = None,
                 lora_name: str | None = None, lora_identity: str | None = None):
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.block_size = block_size
        self.none_hash = none_hash
        self.block_hashes: list[BlockHash] = []
        """Hashes of the request's full blocks so far, in order."""
        secret = salt_secret_from_none_hash(none_hash) if cache_salt is not None else None
        self._first_keys = block_extra_keys(0, cache_salt, lora_name, secret, lora_identity)
        self._rest_keys = block_extra_keys(1, cache_salt, lora_name, None, lora_identity)
        self._first_extra = encode_extra_keys(self._first_keys)
        self._rest_extra = encode_extra_keys(self._rest_keys)

    def extra_keys(self, block_index: int) -> tuple | None:
        """Extra keys of block ``block_index`` (what BlockStored reports for it)."""
        return self._first_keys if block_index == 0 else self._rest_keys

    def extend(self, all_token_ids: Sequence[int]) -> list[BlockHash]:
        """Hashes the blocks completed since the last call; returns only the new hashes."""
        hashes = self.block_hashes
        start_block = len(hashes)
        end_block = len(all_token_ids) // self.block_size
        if end_block <= start_block:
            return []
        bs = self.block_size
        buf = pack_token_ids(all_token_ids[start_block * bs : end_block * bs])
        step = 4 * bs  # bytes per block
        new: list[BlockHash] = []
        append = new.append
        first = 0
        if start_block == 0:
            parent = xxh3_128_digest(self.none_hash + self._first_extra + buf[:step])
            append(parent)
            first = step
        else:
            parent = hashes[-1]
        extra = self._rest_extra
        for offset in range(first, len(buf), step):
            parent = xxh3_128_digest(parent + extra + buf[offset : offset + step])
            append(parent)
        hashes.extend(new)
        return new
