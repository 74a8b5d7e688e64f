"""Where a random row's uniform number comes from: one int64 key per row per step, hashed on the device.

    seeded row    key = seed_key(seed, tokens it generated so far)   its tokens depend on seed and position only
    speculation   key = seed_key(seed, n + j) ^ purpose              draft j's draw, acceptance or residual draw
    unseeded row  key = unseeded_key(runner seed, n)                  n counts the runner's unseeded draws (host)
    greedy row    key = 0                                             (drawn, never used)
    u = seeded_uniforms(key)                                          splitmix64 of the key, top 24 bits: [0, 1)

The host computes the keys with the step's other settings and they go up in its one upload; the device
turns them into uniforms with a few int64 ops. No generator is involved, so nothing a CUDA graph could
bake in, and the eager sampler and the decode graph's sampler draw the same numbers for the same step.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from kvmesh.replica.serving.sampling_params import SEED_MIX, SamplingParams

_MIX_A, _MIX_B, _MASK = SEED_MIX
_SPLITMIX = (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB)
_UNSEEDED = 0x2545F4914F6CDD1D  # keeps the unseeded keys of seed s off the seeded keys of the same s


def seed_key(seed: int, num_generated: int) -> int:
    """The key a seeded request's next token is drawn with: ``(seed*A + n*B + 1) & MASK`` (SEED_MIX), so its
    tokens depend only on the seed and their position (and a continuation's moved seed gives the same key)."""
    return (seed * _MIX_A + num_generated * _MIX_B + 1) & _MASK


DRAFT_DRAW, ACCEPT_DRAW, RESIDUAL_DRAW = 0x5A17C3E1D2B4F6A8, 0x3C6EF372FE94F82B, 0x1F83D9ABFB41BD6B
"""What a speculative draw of a seeded request is for (spec_decode/): XORed into its key so the draws of one
position are independent of each other and of the sampler's, and a continuation's moved seed keeps them."""


def purpose_keys(seed: int, num_generated: int, num: int, purpose: int) -> list[int]:
    """Keys of a seeded request's ``num`` draws for ``purpose`` at output positions ``num_generated + j``."""
    return [seed_key(seed, num_generated + j) ^ purpose for j in range(num)]


def unseeded_key(seed: int, n: int) -> int:
    """The key of the runner's n-th unseeded draw (``seed``: the engine's ``seed`` setting)."""
    return seed_key(seed ^ _UNSEEDED, n)


def _signed(x: int) -> int:
    return x - (1 << 64) if x >= 1 << 63 else x


def _shr(x: torch.Tensor, n: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns (torch's >> is arithmetic)."""
    return (x >> n) & ((1 << (64 - n)) - 1)


def seeded_uniforms(keys: torch.Tensor) -> torch.Tensor:
    """keys [S] int64 -> [S] float32 uniforms in [0, 1), on the keys' device: splitmix64 of each key (int64
    arithmetic wraps modulo 2^64 like uint64), its top 24 bits. A counter-based draw: no generator per row,
    nothing read back, the same numbers on every device, fixed ops a CUDA graph can replay."""
    golden, mul1, mul2 = (_signed(c) for c in _SPLITMIX)
    z = keys + golden
    z = (z ^ _shr(z, 30)) * mul1
    z = (z ^ _shr(z, 27)) * mul2
    z = z ^ _shr(z, 31)
    return _shr(z, 40).to(torch.float32) * (1.0 / (1 << 24))


class RandomDraws:
    """The runner's counter of unseeded draws (one per random row without a seed, in step order)."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.count = 0

    def keys(self, params: Sequence[SamplingParams], num_generated: Sequence[int]) -> np.ndarray:
        """[N] int64 keys of the rows (``num_generated[i]``: tokens row i generated so far); advances the count
        by the unseeded random rows."""
        keys = np.zeros(len(params), np.int64)
        for row, (sp, n) in enumerate(zip(params, num_generated, strict=True)):
            if sp.greedy:
                continue
            if sp.seed is not None:
                keys[row] = seed_key(sp.seed, n)
            else:
                keys[row] = unseeded_key(self.seed, self.count)
                self.count += 1
        return keys
