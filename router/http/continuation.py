"""A migrated stream's continuation request, and its logprobs in the shape the client asked for.

The continuation (router/http/migration.py) is a token-in ``/v1/completions`` stream whose prompt is the user's
prompt + the output sent so far. It samples as the stream did: every sampling field of the original request
goes with it (penalties, ``min_p``, bias, allowed tokens, output-text rules, logprobs), only the budget, the seed
and a structured-output constraint are moved on past the tokens already sent.

Logprobs come back in the completion shape (``{tokens, token_logprobs, top_logprobs, text_offset}``);
``SplicedLogprobs`` turns them into the stream's own: a completion's ``text_offset`` goes on from where the
first replica's stopped, a chat's become ``{"content": [{token, logprob, bytes, top_logprobs}]}`` with the
``top_logprobs`` it asked for (the chosen token first, as the replica's own chat chunks have them).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from kvmesh.replica.openai.logprobs_format import chat_token

if TYPE_CHECKING:
    from kvmesh.replica.openai.protocol import ChatCompletionRequest, CompletionRequest

CARRIED = ("model", "temperature", "top_p", "top_k", "stop_token_ids", "cache_salt", "skip_special_tokens",
           "include_stop_str_in_output", "logit_bias", "allowed_token_ids", "stream_interval", "presence_penalty",
           "frequency_penalty", "repetition_penalty", "min_p", "return_tokens_as_token_ids")
"""Request fields a continuation takes unchanged (those not None)."""


def continuation_body(req: CompletionRequest | ChatCompletionRequest, chat: bool, tokens: list[int],
                      num_output: int, router_finds_stops: bool) -> dict[str, object] | None:
    """The continuation of ``req`` whose prompt is ``tokens`` (prompt + the ``num_output`` tokens sent), None when
    no token is left to generate; ``router_finds_stops``: the router detokenizes, so stop strings stay its job."""
    max_tokens, n = req._max_tokens(), num_output
    if max_tokens is not None and max_tokens - n < 1:
        return None
    body: dict[str, object] = {
        "prompt": tokens, "stream": True, "return_token_ids": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "max_tokens": None if max_tokens is None else max_tokens - n,
        "min_tokens": max(0, req.min_tokens - n), "ignore_eos": req.ignore_eos,
    }
    body.update({name: getattr(req, name) for name in CARRIED if getattr(req, name) is not None})
    logprobs = req._logprobs()[0]  # what the engine samples them with: the completion field says the same
    if logprobs is not None:
        body["logprobs"] = logprobs
    if req.seed is not None:
        body["seed"] = req.continuation_seed(n)
    if (constraint := req.structured_outputs_params()) is not None:  # the output so far matched it: go on
        body["structured_outputs"] = replace(constraint, num_resumed_tokens=constraint.num_resumed_tokens + n
                                             ).to_request()
    if not router_finds_stops and req.stop:
        body["stop"] = req.stop
    return body


class SplicedLogprobs:
    """The logprobs of one stream across its replicas, in its own shape (module doc)."""

    def __init__(self, req: CompletionRequest | ChatCompletionRequest, chat: bool) -> None:
        self.chat = chat
        self.top = (req.top_logprobs or 0) if chat else 0
        """A chat's ``top_logprobs`` per token."""
        self.text_offset = 0
        """A completion's: where the next token's text starts (the characters of the tokens sent)."""

    @staticmethod
    def asked(req: CompletionRequest | ChatCompletionRequest) -> bool:
        return req._logprobs()[0] is not None

    def relayed(self, logprobs: dict | None) -> None:
        """A first replica's chunk went out with ``logprobs`` (in the stream's own shape)."""
        if not self.chat and logprobs and logprobs.get("tokens"):
            self.text_offset = logprobs["text_offset"][-1] + len(logprobs["tokens"][-1])

    def spliced(self, logprobs: dict | None, num_tokens: int) -> dict | None:
        """A continuation chunk's completion-shaped ``logprobs``, cut to its first ``num_tokens`` tokens (those the
        client gets), in the stream's shape."""
        if logprobs is None:
            return None
        tokens = logprobs.get("tokens", [])[:num_tokens]
        chosen = logprobs.get("token_logprobs", [])[:num_tokens]
        tops = logprobs.get("top_logprobs", [])[:num_tokens]
        if self.chat:
            return {"content": [{**chat_token(token, logprob),
                                 "top_logprobs": [chat_token(t, lp) for t, lp in list((top or {}).items())[:self.top]]}
                                for token, logprob, top in zip(tokens, chosen, tops, strict=True)]}
        offsets = []
        for token in tokens:
            offsets.append(self.text_offset)
            self.text_offset += len(token)
        return {"tokens": tokens, "token_logprobs": chosen, "top_logprobs": tops, "text_offset": offsets}

