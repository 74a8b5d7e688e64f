"""Prompt material within a token budget: token-id lists (exact lengths) or words (estimated).

A live CPU cluster serves a tiny model (stories260K: 512-token context, 512-token vocabulary),
so every workload sizes prompts in tokens. Token-id prompts are exact (the completions API
accepts a list of ints); text prompts are made of words and sized with ``tokens_per_word``
(measured once against the server's ``/tokenize`` when it has one).
"""

from __future__ import annotations

import random
from collections.abc import Hashable
from dataclasses import dataclass

# Plain words a small story model's tokenizer knows; order is irrelevant, content deterministic.
WORDS = ["the", "a", "little", "girl", "boy", "cat", "dog", "bird", "tree", "house", "park", "ball", "sun", "moon",
         "star", "day", "night", "happy", "sad", "big", "small", "red", "blue", "green", "friend", "mom", "dad", "play",
         "run", "jump", "look", "see", "find", "go", "come", "went", "said", "was", "is", "had", "has", "with", "and",
         "then", "but", "so", "very", "one", "two", "three", "time", "once", "upon", "lily", "tim", "ben", "sue", "toy",
         "box", "car", "boat", "fish", "water", "sky", "cloud", "rain", "snow", "flower", "garden", "door", "window",
         "bed", "book", "cake", "cookie", "apple", "tea", "milk", "bread", "kind", "brave"]


@dataclass(frozen=True, slots=True)
class PromptMaker:
    """Builds deterministic prompt pieces of a given size in tokens."""

    vocab_size: int = 512
    """Token ids are drawn from [first_token_id, vocab_size) (token-id prompts)."""
    first_token_id: int = 3
    """Smallest token id used (skips BOS/EOS/UNK of Llama-style vocabularies)."""
    tokens_per_word: float = 2.0
    """Estimated tokens per generated word (text prompts)."""

    def __post_init__(self) -> None:
        if self.vocab_size <= self.first_token_id:
            raise ValueError(f"vocab_size {self.vocab_size} must exceed first_token_id {self.first_token_id}")
        if not self.tokens_per_word > 0:
            raise ValueError(f"tokens_per_word must be > 0, got {self.tokens_per_word}")

    def tokens(self, num_tokens: int, key: Hashable) -> list[int]:
        """``num_tokens`` token ids, the same for the same ``key``."""
        rng = random.Random(repr(key))
        return [rng.randrange(self.first_token_id, self.vocab_size) for _ in range(num_tokens)]

    def text(self, num_tokens: int, key: Hashable) -> str:
        """About ``num_tokens`` tokens of words, the same for the same ``key`` (at least one word)."""
        rng = random.Random(repr(key))
        n = max(1, int(num_tokens / self.tokens_per_word))
        return " ".join(rng.choice(WORDS) for _ in range(n))

    def piece(self, num_tokens: int, key: Hashable, as_text: bool) -> list[int] | str:
        return self.text(num_tokens, key) if as_text else self.tokens(num_tokens, key)


def join(parts: list, as_text: bool) -> list[int] | str:
    """Concatenate prompt pieces (token lists, or words separated by blank lines)."""
    if as_text:
        return "\n\n".join(p for p in parts if p)
    out: list[int] = []
    for p in parts:
        out.extend(p)
    return out


def sample_text(num_words: int = 200, seed: int = 0) -> str:
    """Words to measure the server's tokens per word with ``/tokenize``."""
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(num_words))
