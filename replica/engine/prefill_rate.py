"""How fast this engine prefills, measured on its own steps (the router prices a cache miss with it).

Each step that computes prompt tokens adds its tokens and its wall time to two decayed sums; the rate
is their ratio, so large steps weigh in proportion to their size and a step's fixed overhead is
spread over its tokens as it is in reality. ``decay`` per step forgets old steps (load and prompt
mix change).
"""

from __future__ import annotations


class PrefillRate:
    """Prompt tokens per second over recent prefill steps; None until one was measured."""

    def __init__(self, decay: float = 0.9) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {decay}")
        self.decay = decay
        self._tokens = 0.0
        self._seconds = 0.0

    def record(self, num_tokens: int, seconds: float) -> None:
        """One step computed ``num_tokens`` tokens, prompt tokens among them, in ``seconds``."""
        if num_tokens <= 0 or seconds <= 0:
            return
        self._tokens = self._tokens * self.decay + num_tokens
        self._seconds = self._seconds * self.decay + seconds

    @property
    def tokens_per_s(self) -> float | None:
        return self._tokens / self._seconds if self._seconds > 0 else None
