"""Incremental detokenization and stop-string matching.

Decoding one token at a time is not enough (SentencePiece spaces, multi-byte characters split across
tokens), so the text is re-decoded over a short sliding window (vLLM's offsets method):

    ids:  [... prompt tail ... | o0 o1 ... o(k-1) | ok ]
           ^prefix_offset              ^read_offset
    delta = decode(ids[prefix_offset:])[len(decode(ids[prefix_offset:read_offset])):]

A delta ending in U+FFFD (an incomplete UTF-8 sequence) is held back until the next token completes it.
With stop strings, the last ``max(len(stop)) - 1`` characters are held back too, so a stop string that
arrives split over several tokens is never streamed out; a matched stop string is cut off the text, or kept
as its end with ``include_stop_str_in_output`` (then nothing is held back: vLLM's rule). Special tokens are
decoded as text only with ``skip_special_tokens=False``.
"""

from __future__ import annotations

from collections.abc import Callable

from kvmesh.replica.serving.hf_tokenizer import HFTokenizer
from kvmesh.replica.serving.sampling_params import SamplingParams

PROMPT_CONTEXT_TOKENS = 5  # prompt tokens kept as decoding context for the first output token


class IncrementalDetokenizer:
    """Turns one request's output tokens into text, step by step, and finds stop strings."""

    __slots__ = ("_decode", "_ids", "_prefix_offset", "_read_offset", "_text", "_emitted", "_stop",
                 "_hold", "_min_tokens", "_num_tokens", "_keep_stop", "_reach")

    def __init__(self, tokenizer: HFTokenizer, prompt_token_ids: list[int], params: SamplingParams) -> None:
        self._decode = _fast_decoder(tokenizer, params.skip_special_tokens)
        self._ids = list(prompt_token_ids[-PROMPT_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._text = ""  # decoded output text (stop string cut off once matched)
        self._emitted = 0  # characters of _text already returned as deltas
        self._stop = list(params.stop)
        self._keep_stop = params.include_stop_str_in_output
        self._reach = max((len(s) for s in self._stop), default=1) - 1  # a stop string may start this far back
        self._hold = 0 if self._keep_stop else self._reach  # characters not streamed yet
        self._min_tokens = params.min_tokens
        self._num_tokens = 0

    @property
    def text(self) -> str:
        return self._text

    def update(self, token_id: int) -> str | None:
        """Add one output token. Returns the stop string it completed, else None."""
        self._num_tokens += 1
        ids = self._ids
        ids.append(token_id)
        prefix_text = self._decode(ids[self._prefix_offset:self._read_offset])
        new_text = self._decode(ids[self._prefix_offset:])
        if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
            return None
        delta = new_text[len(prefix_text):]
        self._prefix_offset = self._read_offset
        self._read_offset = len(ids)
        if len(ids) > 64:  # keep the window short; offsets only ever look back a few tokens
            cut = self._prefix_offset
            del ids[:cut]
            self._prefix_offset -= cut
            self._read_offset -= cut
        start = max(0, len(self._text) - self._reach)
        self._text += delta
        if self._stop and self._num_tokens >= self._min_tokens:
            return self._match_stop(start)
        return None

    def _match_stop(self, start: int) -> str | None:
        for stop in self._stop:
            idx = self._text.find(stop, start)
            if idx != -1:
                self._text = self._text[:idx + len(stop) if self._keep_stop else idx]
                return stop
        return None

    def take_delta(self, finished: bool) -> str:
        """Text that became final since the last call (everything left when ``finished``)."""
        end = len(self._text) if finished else max(self._emitted, len(self._text) - self._hold)
        delta = self._text[self._emitted:end]
        self._emitted = end
        return delta

    def visible_text(self, finished: bool) -> str:
        """All text returned so far."""
        return self._text[:self._emitted] if not finished else self._text


def _fast_decoder(tokenizer: HFTokenizer, skip_special_tokens: bool) -> Callable[[list[int]], str]:
    """``ids -> str`` (special tokens skipped or not); uses the Rust tokenizer directly when there is one."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if backend is not None and hasattr(backend, "decode"):
        return lambda ids: backend.decode(ids, skip_special_tokens=skip_special_tokens)
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
