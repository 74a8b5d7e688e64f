"""The engine's per-token logprobs -> vLLM's OpenAI response shapes (torch-free).

    completions  {"tokens": [str], "token_logprobs": [float|None], "top_logprobs": [{str: float}|None],
                  "text_offset": [int]}
                 top_logprobs of a position: the chosen token first, then the most likely ones, at most
                 ``logprobs + 1`` distinct tokens (OpenAI's rule, vLLM's order); keys are decoded tokens.
    chat         {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}
                 top_logprobs: the first ``top_logprobs`` distinct tokens of the same list (vLLM's order).

Logprobs are of the raw model distribution (before temperature, top-k/top-p, logit_bias: vLLM's default
``logprobs_mode="raw_logprobs"``); -inf is sent as -9999.0, as OpenAI and vLLM do. A token is decoded
alone (``decode([id])``) with the leading spaces SentencePiece's "▁" stands for restored, as vLLM does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypedDict

MIN_LOGPROB = -9999.0
"""What -inf becomes in JSON (OpenAI's and vLLM's value)."""
SPACE_MARKER = "▁"
"""SentencePiece's word-start marker: a vocab piece starting with it stands for a leading space."""


class TokenLogprobsLike(Protocol):
    """The engine's ``replica.step.outputs.TokenLogprobs`` (the chosen token first, then the top-k)."""

    token_ids: list[int]
    logprobs: list[float]
    rank: int


class HFTokenizerLike(Protocol):
    """What ``token_decoder`` needs of a Hugging Face tokenizer (``Tokenizer.hf``)."""

    def decode(self, token_ids: list[int]) -> str: ...

    def convert_ids_to_tokens(self, ids: int) -> str | None: ...


class HasHFTokenizer(Protocol):
    hf: HFTokenizerLike


class _TopLogprobs(TypedDict, total=False):
    """The part of ``ChatLogprob`` only the chosen token has (a TypedDict's optional keys, Python 3.10's way)."""

    top_logprobs: list[ChatLogprob]
    """The most likely tokens at this position (on the chosen token only)."""


class ChatLogprob(_TopLogprobs):
    """One token of a chat choice's ``logprobs.content`` (OpenAI's ``ChatCompletionTokenLogprob``)."""

    token: str
    """The token's text."""
    logprob: float
    """Its log probability, -inf clamped to ``MIN_LOGPROB``."""
    bytes: list[int]
    """Its UTF-8 bytes."""


TokenDecoder = Callable[[int], str]


def token_decoder(hf_tokenizer: HFTokenizerLike) -> TokenDecoder:
    """``token_id -> str`` for one token alone, with a SentencePiece piece's leading spaces kept."""
    cache: dict[int, str] = {}

    def decode(token_id: int) -> str:
        text = cache.get(token_id)
        if text is None:
            text = hf_tokenizer.decode([token_id]) or ""
            piece = hf_tokenizer.convert_ids_to_tokens(token_id) or ""
            markers = len(piece) - len(piece.lstrip(SPACE_MARKER))
            missing = markers - (len(text) - len(text.lstrip(" ")))
            if missing > 0:
                text = " " * missing + text
            cache[token_id] = text
        return text

    return decode


class TokenStrings:
    """A server's token strings for logprobs: one token alone -> its text (``token_decoder``, built on first use
    and caching what it decoded), or its id as text for a request with ``return_tokens_as_token_ids``."""

    def __init__(self, tokenizer: HasHFTokenizer):
        self._tokenizer = tokenizer
        self._decoder: TokenDecoder | None = None

    def decoder(self, as_token_ids: bool) -> TokenDecoder:
        if self._decoder is None:
            self._decoder = token_decoder(self._tokenizer.hf)
        return token_id_text if as_token_ids else self._decoder


def token_id_text(token_id: int) -> str:
    """A token as ``"token_id:{id}"`` (vLLM's ``return_tokens_as_token_ids``: tokens whose text is not valid
    UTF-8 alone stay identifiable)."""
    return f"token_id:{token_id}"


def _clamp(logprob: float) -> float:
    return max(logprob, MIN_LOGPROB)


def distinct_candidates(entry: TokenLogprobsLike, limit: int) -> list[tuple[int, float]]:
    """The first ``limit`` distinct (token id, logprob) pairs of ``entry``, the chosen token first."""
    seen: dict[int, float] = {}
    for token_id, logprob in zip(entry.token_ids, entry.logprobs, strict=True):
        if len(seen) >= limit:
            break
        seen.setdefault(token_id, logprob)
    return list(seen.items())


def completion_logprobs(token_ids: Sequence[int], entries: Sequence[TokenLogprobsLike | None], num_logprobs: int,
                        decode: TokenDecoder, initial_text_offset: int = 0) -> dict[str, list]:
    """The ``logprobs`` object of a completion choice (or of one streamed chunk's tokens).

    ``entries[i]`` belongs to ``token_ids[i]``; None (an echoed prompt's first token) gives a null
    logprob and null top_logprobs. ``text_offset[i]`` is where token i starts in the choice's text,
    counting from ``initial_text_offset`` (the text already sent, when streaming).
    """
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float] | None] = []
    text_offset: list[int] = []
    offset = initial_text_offset
    for token_id, entry in zip(token_ids, entries, strict=True):
        token = decode(token_id)
        tokens.append(token)
        text_offset.append(offset)
        offset += len(token)
        if entry is None:
            token_logprobs.append(None)
            top_logprobs.append(None)
            continue
        token_logprobs.append(_clamp(entry.logprobs[0]))
        top_logprobs.append({decode(t): _clamp(lp) for t, lp in distinct_candidates(entry, num_logprobs + 1)})
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs,
            "text_offset": text_offset}


def prompt_logprobs(entries: Sequence[TokenLogprobsLike | None], num: int, decode: TokenDecoder) -> list[dict | None]:
    """vLLM's ``prompt_logprobs``: per prompt position (the first None), the prompt's token then the ``num`` most
    likely, each ``{"logprob", "rank", "decoded_token"}`` keyed by its token id."""
    out: list[dict | None] = []
    for entry in entries:
        if entry is None:
            out.append(None)
            continue
        chosen = entry.token_ids[0]
        position = {str(chosen): {"logprob": _clamp(entry.logprobs[0]), "rank": entry.rank,
                                  "decoded_token": decode(chosen)}}
        top = zip(entry.token_ids[1:num + 1], entry.logprobs[1:num + 1], strict=True)
        for rank, (token_id, logprob) in enumerate(top, 1):
            position.setdefault(str(token_id), {"logprob": _clamp(logprob), "rank": rank,
                                                "decoded_token": decode(token_id)})
        out.append(position)
    return out


def attach_prompt_logprobs(payload: dict, num: int | None, by_prompt: dict[int, Sequence],
                           prompt_of_choice: Sequence[int], decode: TokenDecoder) -> None:
    """Add ``prompt_logprobs`` (when ``num`` is asked) to an answer: to each completion choice (the entries of its
    prompt, ``by_prompt[prompt_of_choice[i]]``), or once to a chat answer."""
    if num is None:
        return
    shaped = [None if (entries := by_prompt.get(i)) is None else prompt_logprobs(entries, num, decode)
              for i in prompt_of_choice]
    if payload["object"] == "chat.completion":
        payload["prompt_logprobs"] = shaped[0] if shaped else None
    else:
        for choice, one in zip(payload["choices"], shaped, strict=True):
            choice["prompt_logprobs"] = one


def chat_token(token: str, logprob: float) -> ChatLogprob:
    """One token of a chat answer's logprobs: its text, logprob and UTF-8 bytes."""
    return {"token": token, "logprob": _clamp(logprob), "bytes": list(token.encode("utf-8", errors="replace"))}


def chat_logprobs(token_ids: Sequence[int], entries: Sequence[TokenLogprobsLike], top_logprobs: int,
                  decode: TokenDecoder) -> dict[str, list]:
    """The ``logprobs`` object of a chat choice (or of one streamed delta's tokens)."""
    content = []
    for token_id, entry in zip(token_ids, entries, strict=True):
        item = chat_token(decode(token_id), entry.logprobs[0])
        item["top_logprobs"] = [chat_token(decode(t), lp) for t, lp in distinct_candidates(entry, top_logprobs)]
        content.append(item)
    return {"content": content}


def choice_logprobs(prompt_token_ids: Sequence[int], prompt_entries: Sequence[TokenLogprobsLike | None] | None,
                    output_token_ids: Sequence[int], output_entries: Sequence[TokenLogprobsLike | None],
                    num_logprobs: int, decode: TokenDecoder, echo: bool,
                    initial_text_offset: int = 0) -> dict[str, list]:
    """A completion choice's (or chunk's) ``logprobs``: with ``echo``, the prompt's tokens first (the
    first one null; all null when ``prompt_entries`` is None), then the output tokens', as vLLM returns."""
    parts = []
    offset = initial_text_offset
    if echo:
        entries = prompt_entries if prompt_entries is not None else [None] * len(prompt_token_ids)
        parts.append(completion_logprobs(prompt_token_ids, entries, num_logprobs, decode, offset))
        offset += sum(map(len, parts[0]["tokens"]))
    parts.append(completion_logprobs(output_token_ids, output_entries, num_logprobs, decode, offset))
    merged: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for part in parts:
        for key, values in merged.items():
            values.extend(part[key])
    return merged
