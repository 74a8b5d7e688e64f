"""Token ids for trace blocks: a hash id always gives the same block of ids (``block_token_ids``),
memoized per hash id (``BlockTokenCache``), so a replay keeps the trace's prefix structure."""

from __future__ import annotations

import math

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finalizer, vectorized (uint64 arithmetic wraps)."""
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def block_token_ids(hash_id: int, block_tokens: int, vocab_size: int, seed: int = 0,
                    first_token_id: int = 3) -> np.ndarray:
    """Deterministic token ids for one trace block: the same id always gives the same tokens.

    Ids are drawn from ``[first_token_id, vocab_size)`` (skipping the usual special tokens
    0..2) by a counter-based generator (SplitMix64 of ``(seed, hash_id, position)``): ~10 us
    per 512-token block, no PRNG object per block. Returns ``# [block_tokens]`` int64.
    """
    if vocab_size <= first_token_id:
        raise ValueError(f"vocab_size {vocab_size} must exceed first_token_id {first_token_id}")
    # 1-element arrays, not scalars: numpy wraps array arithmetic silently.
    key = _splitmix64(np.array([seed & (2**64 - 1)], dtype=np.uint64))
    base = _splitmix64(key ^ np.uint64(hash_id & (2**64 - 1)))
    x = _splitmix64(base + np.arange(block_tokens, dtype=np.uint64) * _GOLDEN)
    return (x % np.uint64(vocab_size - first_token_id)).astype(np.int64) + first_token_id


class BlockTokenCache:
    """Memoizes :func:`block_token_ids` per hash id (uint16/int32 arrays: 1 KiB per 512-token block)."""

    def __init__(self, block_tokens: int, vocab_size: int, seed: int = 0):
        self.block_tokens = block_tokens
        self.vocab_size = vocab_size
        self.seed = seed
        self._dtype = np.uint16 if vocab_size <= 1 << 16 else np.int32
        self._blocks: dict[int, np.ndarray] = {}

    def block(self, hash_id: int) -> np.ndarray:
        arr = self._blocks.get(hash_id)
        if arr is None:
            arr = block_token_ids(hash_id, self.block_tokens, self.vocab_size, self.seed).astype(self._dtype)
            self._blocks[hash_id] = arr
        return arr

    def prompt(self, hash_ids: tuple[int, ...] | list[int], num_tokens: int) -> list[int]:
        """The prompt's token ids: the blocks of ``hash_ids`` concatenated, cut to ``num_tokens``."""
        need = math.ceil(num_tokens / self.block_tokens)
        if need > len(hash_ids):
            raise ValueError(f"{num_tokens} tokens need {need} blocks of {self.block_tokens}, got {len(hash_ids)}")
        parts = [self.block(h) for h in hash_ids[:need]]
        return np.concatenate(parts)[:num_tokens].tolist()
