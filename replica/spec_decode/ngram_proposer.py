"""Prompt-lookup drafts (vLLM's ``NgramProposer``): the request's last n tokens are looked up earlier in its
own prompt and output, and the tokens that followed the match are proposed.

    tokens: ... a b c d ... x a b c   (n = 3: "a b c" ends the sequence and occurred before)
    drafts:       d ...               (up to K tokens that followed the earlier occurrence)

The longest n in [prompt_lookup_min, prompt_lookup_max] with a match wins; among its matches the first.
"""

from __future__ import annotations

import numpy as np
from kvmesh.replica.spec_decode.config import SpeculativeConfig
from numpy.lib.stride_tricks import sliding_window_view


class NgramProposer:
    def __init__(self, config: SpeculativeConfig) -> None:
        self.k = config.num_speculative_tokens
        self.min_n, self.max_n = config.prompt_lookup_min, config.prompt_lookup_max

    def propose(self, token_ids: list[int], max_drafts: int) -> list[int]:
        """Up to ``min(K, max_drafts)`` draft tokens continuing ``token_ids`` ([] when no n-gram recurs)."""
        k = min(self.k, max_drafts)
        num = len(token_ids)
        if k <= 0 or num <= self.min_n:
            return []
        tokens = np.asarray(token_ids, dtype=np.int64)
        for n in range(min(self.max_n, num - 1), self.min_n - 1, -1):
            windows = sliding_window_view(tokens[:num - 1], n)  # every earlier n-gram that has a successor
            hits = np.flatnonzero((windows == tokens[num - n:]).all(axis=1))
            if len(hits):
                start = int(hits[0]) + n
                return token_ids[start:start + k]
        return []
