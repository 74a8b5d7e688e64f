"""Router-side block keys: a fast 64-bit chain over token ids, independent of the replicas' seed.

The router never sees the replicas' secret hash seed. It computes its own chained key for every
full block, both from the ``token_ids`` carried by ``BlockStored`` events and from a request's
prompt, so the two sides agree whenever the tokens (and extra keys) agree::

    key_0 = xxh3_64(tokens_0 [+ extra_0], seed=root_seed)
    key_i = xxh3_64(tokens_i [+ extra_i], seed=key_{i-1})

Tokens are packed as little-endian uint32 (4 bytes each), so a block's token bytes have a fixed
length and any extra-key bytes appended after them are unambiguous. Extra keys (cache salt digest,
LoRA name and the identity of its weights) come from ``kvmesh.kvcache.hashing.block_extra_keys`` for requests and from
the event's
``extra_keys`` for stored blocks; both are msgpack-encoded, so a tuple and the list it becomes on
the wire give the same bytes.

The chain (and the index match) run in a compiled extension, ``kvmesh.router._fastpath``
(router/_native/fastpath.c), when it was built; the pure-Python code here gives identical
results and is used when it was not, or when ``KVMESH_NO_NATIVE=1`` is set.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Sequence

import msgspec
import xxhash

# Default root seed of the chain. Router keys are private to one router process (they are never
# sent anywhere), so a fixed default is fine; the HTTP router picks a random one per process.
DEFAULT_ROUTER_SEED = 0x6B766D657368  # "kvmesh"

_hash = xxhash.xxh3_64_intdigest
_encode_extra = msgspec.msgpack.Encoder().encode


def _load_fastpath():
    """The compiled hot path, or None (not built, or turned off with KVMESH_NO_NATIVE=1)."""
    if os.environ.get("KVMESH_NO_NATIVE", "") not in ("", "0"):
        return None
    try:
        from kvmesh.router import _fastpath
    except ImportError:
        return None
    return _fastpath


FASTPATH = _load_fastpath()
"""``kvmesh.router._fastpath`` when built and allowed, else None (pure Python)."""


def pack_tokens(token_ids: Sequence[int]) -> bytes:
    """Token ids as little-endian uint32 bytes; ValueError for an id outside [0, 2**32)."""
    packed = array("I")
    try:
        # fromlist reads list items directly: ~30% faster than array("I", ids), which iterates.
        packed.fromlist(token_ids if type(token_ids) is list else list(token_ids))
        return packed.tobytes()
    except OverflowError:
        raise ValueError(f"token ids must be in [0, 2**32); got one outside in {list(token_ids)[:8]}...") from None


def chain_keys_py(
    token_bytes: bytes,
    num_blocks: int,
    block_size: int,
    parent_key: int,
    extra_keys: Sequence | None = None,
) -> list[int]:
    """Chained keys of ``num_blocks`` blocks packed in ``token_bytes``, continuing ``parent_key``.

    ``extra_keys`` is None or one entry per block (None for a block without extra keys).
    """
    stride = 4 * block_size
    keys: list[int] = []
    append = keys.append
    key = parent_key
    if extra_keys is None:
        for start in range(0, num_blocks * stride, stride):
            key = _hash(token_bytes[start : start + stride], key)
            append(key)
        return keys
    for i in range(num_blocks):
        start = i * stride
        data = token_bytes[start : start + stride]
        extra = extra_keys[i]
        if extra is not None:
            data += _encode_extra(extra)
        key = _hash(data, key)
        append(key)
    return keys


def chain_keys_native(
    tokens: bytes | list[int],
    num_blocks: int,
    block_size: int,
    parent_key: int,
    extra_keys: Sequence | None = None,
) -> list[int]:
    """``chain_keys_py`` in C; ``tokens`` may also be the token ids themselves (packed in C)."""
    extras = None if extra_keys is None else [None if e is None else _encode_extra(e) for e in extra_keys]
    return FASTPATH.chain_keys(tokens, num_blocks, block_size, parent_key, extras)


def chain_keys(token_bytes: bytes, num_blocks: int, block_size: int, parent_key: int,
               extra_keys: Sequence | None = None) -> list[int]:
    """Chained keys of packed blocks: the compiled chain when built, else ``chain_keys_py``."""
    if FASTPATH is None:
        return chain_keys_py(token_bytes, num_blocks, block_size, parent_key, extra_keys)
    return chain_keys_native(token_bytes, num_blocks, block_size, parent_key, extra_keys)


class RouterKeyHasher:
    """Computes a request's router keys (one per full block) from its token ids."""

    __slots__ = ("block_size", "native", "salt_secret", "seed")

    def __init__(self, block_size: int = 16, seed: int = DEFAULT_ROUTER_SEED,
                 salt_secret: bytes | None = None, native: bool = True) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        if not 0 <= seed < 2**64:
            raise ValueError(f"seed must be an unsigned 64-bit int, got {seed}")
        self.block_size = block_size
        """Tokens per block; must equal the replicas' block size."""
        self.seed = seed
        """Root seed of the key chain (the parent key of block 0)."""
        self.salt_secret = salt_secret
        """SECRET: key of the replicas' cache-salt digests (``kvcache.hashing.cache_salt_secret``);
        None: salted requests get keys no replica's blocks have (routed without prefix matches)."""
        self.native = native and FASTPATH is not None
        """Whether keys (and the index's match) use the compiled fast path; same results either way."""

    def salt_secret_check(self) -> str | None:
        """The check of its salt secret a replica's ``/server_info`` reports of its own (None: it has none)."""
        from kvmesh.kvcache.hashing import salt_secret_check

        return salt_secret_check(self.salt_secret)

    def keys(
        self,
        token_ids: Sequence[int],
        cache_salt: str | None = None,
        lora_name: str | None = None,
        lora_identity: str | None = None,
    ) -> list[int]:
        """Router keys of the full blocks of ``token_ids`` (a trailing partial block has none); ``lora_identity``:
        the identity of the adapter's weights the replicas report (``/load``'s ``lora.identities``)."""
        num_blocks = len(token_ids) // self.block_size
        if num_blocks == 0:
            return []
        extra = None
        if cache_salt is not None or lora_name is not None:
            extra = request_extra_keys(num_blocks, cache_salt, lora_name, self.salt_secret, lora_identity)
        if self.native:
            ids = token_ids if type(token_ids) is list else list(token_ids)
            return chain_keys_native(ids, num_blocks, self.block_size, self.seed, extra)
        token_bytes = pack_tokens(token_ids[: num_blocks * self.block_size])
        return chain_keys_py(token_bytes, num_blocks, self.block_size, self.seed, extra)

    def chain(self, tokens: bytes | list[int], num_blocks: int, parent_key: int,
              extra_keys: Sequence | None = None) -> list[int]:
        """Keys of ``num_blocks`` blocks (packed bytes or token ids) continuing ``parent_key``."""
        if self.native:
            return chain_keys_native(tokens, num_blocks, self.block_size, parent_key, extra_keys)
        if type(tokens) is not bytes:
            tokens = pack_tokens(tokens[: num_blocks * self.block_size])
        return chain_keys_py(tokens, num_blocks, self.block_size, parent_key, extra_keys)


def request_extra_keys(num_blocks: int, cache_salt: str | None, lora_name: str | None,
                       salt_secret: bytes | None = None, lora_identity: str | None = None) -> list:
    """Per-block extra keys of a request, exactly as the replicas' hasher derives them."""
    from kvmesh.kvcache.hashing import block_extra_keys

    first = block_extra_keys(0, cache_salt, lora_name, salt_secret, lora_identity)
    rest = block_extra_keys(1, cache_salt, lora_name, None, lora_identity) if num_blocks > 1 else None
    return [first] + [rest] * (num_blocks - 1)
