"""One request's answer while it is rendered (answer_renderer.py): what a kind of answer holds and gives.

    body     the whole answer's response from its chosen choices, each one shaped by the kind
             (chat_render.py: reasoning -> tools -> logprobs; completion_render.py: echo -> logprobs)
    chunks   the kind's SSE chunks as the engine's outputs come

The renderer adds what the kinds share: the usage, the prompt logprobs, the usage chunk and ``[DONE]``. A kind
calls only down (the parsers, the logprobs format, the usage of an output), never back up into the renderer.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, ClassVar

from kvmesh.replica.openai import responses
from kvmesh.replica.openai.logprobs_format import TokenDecoder
from kvmesh.replica.server.parallel_sampling import Candidate, Outputs
from kvmesh.replica.step.outputs import RequestOutput

if TYPE_CHECKING:
    from kvmesh.replica.openai.config import FrontendConfig
    from kvmesh.replica.openai.logprobs_format import TokenStrings
    from kvmesh.replica.openai.protocol import ChatCompletionRequest, CompletionRequest
    from kvmesh.replica.serving.tokenizer import Tokenizer
    from pydantic import BaseModel

Chosen = list[tuple[int, Candidate, RequestOutput]]
"""(index, candidate, final output) of each returned choice (parallel_sampling.select_choices)."""


class RenderedAnswer(ABC):
    """The answer to one request: its id and model, the candidates behind its choices, and what shapes them."""

    chunk_class: ClassVar[type[responses.ChatCompletionChunk] | type[responses.CompletionChunk]]
    """The kind's SSE chunk (the usage chunk is one with no choices)."""

    def __init__(self, req: CompletionRequest | ChatCompletionRequest, request_id: str, model: str,
                 candidates: list[Candidate], frontend: FrontendConfig, tokenizer: Tokenizer,
                 token_strings: TokenStrings):
        self.req = req
        self.request_id = request_id
        self.model = model
        self.candidates = candidates
        self.frontend = frontend  # the server's reasoning and tool-call parsers
        self.tokenizer = tokenizer  # an echoed prompt's text
        self.token_strings = token_strings  # logprobs' token strings

    def decode(self) -> TokenDecoder:
        """A token's text in this request's logprobs."""
        return self.token_strings.decoder(self.req.return_tokens_as_token_ids)

    @abstractmethod
    def body(self, chosen: Chosen, finals: list[RequestOutput], usage: responses.UsageInfo) -> BaseModel:
        """The whole answer's response: its choices and ``usage``."""

    @abstractmethod
    def chunks(self, created: int, streams: list[Outputs], finals: list[RequestOutput | None]) -> AsyncIterator[str]:
        """Every choice's SSE chunks as they come; a choice's final output goes into ``finals`` once it is sent."""
