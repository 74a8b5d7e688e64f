"""OpenAI-compatible response models and SSE chunks (torch-free)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from typing import ClassVar, Literal
from urllib.parse import quote

from kvmesh.replica.serving.errors import ProtocolError
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    JsonValue,
    SerializerFunctionWrapHandler,
    model_serializer,
)

_COLLECTIONS = frozenset({"list", "dict", "set", "frozenset", "tuple"})


def _fail_fast(schema: object) -> object:
    """``schema`` (a pydantic-core schema) with ``fail_fast`` on every collection in it."""
    if isinstance(schema, dict):
        if schema.get("type") in _COLLECTIONS:
            schema["fail_fast"] = True
        for value in schema.values():
            _fail_fast(value)
    elif isinstance(schema, list):
        for value in schema:
            _fail_fast(value)
    return schema


class OpenAIBaseModel(BaseModel):
    # Clients send fields this server does not know (OpenAI adds some each release): accept and ignore them.
    model_config = ConfigDict(extra="ignore")
    __token_id_fields__: ClassVar[tuple[str, ...]] = ()
    """Fields validated in C when they hold token ids (errors.parse_request); none by default."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: type[BaseModel],
                                     handler: GetCoreSchemaHandler):  # -> pydantic-core's CoreSchema
        """The model's schema with every list and object validated fail-fast: a 100,000-item list of wrong items is
        one error, not 100,000 (~1 s and ~100 MB to build, for a message that shows the first few)."""
        return _fail_fast(handler(source))


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def answer_id(random: str, client_request_id: str | None) -> str:
    """The answer's id: ``random`` (``prefix-hex``), or with a client's ``request_id`` ``prefix-request_id``
    (vLLM's ``cmpl-{request_id}``)."""
    return f"{random.split('-', 1)[0]}-{client_request_id}" if client_request_id else random


_HEADER_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) != "%")
"""Printable ASCII but space and ``%``: what an id header carries as it is."""


def id_header(answer_id: str) -> str:
    """``answer_id`` as an ``X-Request-Id`` header value: as it is when it is printable ASCII, else percent-encoded
    (a client's ``request_id`` may hold any character; a header cannot)."""
    return quote(answer_id, safe=_HEADER_SAFE)


class TokenizeResponse(OpenAIBaseModel):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeResponse(OpenAIBaseModel):
    prompt: str


class PromptTokensDetails(OpenAIBaseModel):
    cached_tokens: int = 0
    """Prompt tokens whose KV came from the prefix cache."""
    host_cached_tokens: int | None = None
    """kvmesh: the part of ``cached_tokens`` loaded back from the replica's host-memory tier; written only
    by a replica that has one (``--kv-offload-memory``)."""

    @model_serializer(mode="wrap")
    def _without_absent_tier(self, handler: SerializerFunctionWrapHandler) -> dict:
        data = handler(self)
        if data.get("host_cached_tokens") is None:
            data.pop("host_cached_tokens", None)  # responses without a tier keep OpenAI's exact shape
        return data


class UsageInfo(OpenAIBaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int, cached_tokens: int,
           host_cached_tokens: int | None = None) -> UsageInfo:
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens,
                                                      host_cached_tokens=host_cached_tokens),
        )


FinishReason = Literal["stop", "length", "abort", "error", "tool_calls"] | None


def _unset(value: object) -> bool:
    """A field left None is absent from the JSON unless asked for (``Field(default=None, exclude_if=_unset)``)."""
    return value is None


class CompletionChoice(OpenAIBaseModel):
    index: int = 0
    text: str
    logprobs: dict[str, list] | None = None
    """{tokens, token_logprobs, top_logprobs, text_offset} (logprobs_format.py)."""
    finish_reason: FinishReason = None
    token_ids: list[int] | None = Field(default=None, exclude_if=_unset)
    """The new token ids behind ``text`` (streaming with ``return_token_ids`` only)."""


class CompletionResponse(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: random_id("cmpl"))
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class ReasoningOut(OpenAIBaseModel):
    """A chat answer's reasoning (the server's reasoning parser's), under both names clients read:
    ``reasoning_content`` (DeepSeek's API, which vLLM followed first) and ``reasoning`` (vLLM's current name).
    Absent without a reasoning parser or with ``include_reasoning: false``."""

    reasoning_content: str | None = Field(default=None, exclude_if=_unset)
    reasoning: str | None = Field(default=None, exclude_if=_unset)

    def with_reasoning(self, text: str | None) -> None:
        self.reasoning_content = self.reasoning = text


class ChatMessageOut(ReasoningOut):
    role: str = "assistant"
    content: str | None = None
    tool_calls: list[dict[str, JsonValue]] | None = Field(default=None, exclude_if=_unset)
    """The calls the answer makes (``{"id", "type": "function", "function": {"name", "arguments"}}``)."""


class ChatCompletionChoice(OpenAIBaseModel):
    index: int = 0
    message: ChatMessageOut
    logprobs: dict[str, list] | None = None
    """{content: [{token, logprob, bytes, top_logprobs}]} (logprobs_format.py)."""
    finish_reason: FinishReason = None


class ChatCompletionResponse(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: random_id("chatcmpl"))
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionChoice]
    usage: UsageInfo | None = None


class DeltaMessage(ReasoningOut):
    """A streamed chat chunk's delta: ``{"role": "assistant", "content": ""}`` first, then ``{"content": ...}``
    (vLLM's shape: no null fields)."""

    role: str | None = Field(default=None, exclude_if=_unset)
    content: str | None = Field(default=None, exclude_if=_unset)
    tool_calls: list[dict[str, JsonValue]] | None = Field(default=None, exclude_if=_unset)
    """Tool-call deltas: ``{"index", "id", "type", "function": {"name", "arguments": ""}}`` when a call starts,
    then ``{"index", "function": {"arguments": chunk}}``."""


class ChatStreamChoice(OpenAIBaseModel):
    index: int = 0
    delta: DeltaMessage
    logprobs: dict[str, list] | None = None
    finish_reason: FinishReason = None
    token_ids: list[int] | None = Field(default=None, exclude_if=_unset)
    """The new token ids behind ``delta`` (``return_token_ids`` only)."""
    error: dict[str, JsonValue] | None = Field(default=None, exclude_if=_unset)
    """(kvmesh) With ``finish_reason: "error"`` for the request's own error: the error a whole answer is (a 400's
    ``{"message", "type", "param", "code"}``), so a stream tells what to change; absent otherwise."""


class ChatCompletionChunk(OpenAIBaseModel):
    """One SSE chunk of a streamed chat completion (``data: {json}\\n\\n``)."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatStreamChoice]
    usage: UsageInfo | None = None
    prompt_token_ids: list[int] | None = Field(default=None, exclude_if=_unset)
    """The prompt's token ids, on the first chunk of a stream with ``return_token_ids``."""


class CompletionChunk(OpenAIBaseModel):
    """One SSE chunk of a streamed completion."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None
    prompt_token_ids: list[int] | None = Field(default=None, exclude_if=_unset)
    """The prompt's token ids, on the first chunk of a stream with ``return_token_ids``."""


class ModelPermission(OpenAIBaseModel):
    """vLLM's (OpenAI's old) permission entry: clients built against vLLM read it, kvmesh grants what it serves."""

    id: str = Field(default_factory=lambda: random_id("modelperm"))
    object: Literal["model_permission"] = "model_permission"
    created: int = Field(default_factory=lambda: int(time.time()))
    allow_create_engine: bool = False
    allow_sampling: bool = True
    allow_logprobs: bool = True
    allow_search_indices: bool = False
    allow_view: bool = True
    allow_fine_tuning: bool = False
    organization: str = "*"
    group: str | None = None
    is_blocking: bool = False


class ModelCard(OpenAIBaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "kvmesh"
    root: str | None = None
    max_model_len: int | None = None
    parent: str | None = None
    """The base model's name for a LoRA adapter (vLLM's); None for a base model."""
    permission: list[ModelPermission] = Field(default_factory=lambda: [ModelPermission()])


class ModelList(OpenAIBaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def card_named(cards: Sequence[JsonValue], model_id: str) -> JsonValue:
    """``GET /v1/models/{id}``: the card of ``model_id`` among ``cards``; a 404 naming what is served."""
    card = next((c for c in cards if isinstance(c, dict) and c.get("id") == model_id), None)
    if card is None:
        served = ", ".join(f"`{c['id']}`" for c in cards if isinstance(c, dict))
        raise ProtocolError(f"The model `{model_id[:200]}` does not exist; this server serves {served} (see "
                            "/v1/models).", 404, param="model")
    return card


SSE_DONE = "data: [DONE]\n\n"


def sse(obj: BaseModel | dict) -> str:
    """One server-sent event carrying ``obj`` as JSON."""
    if isinstance(obj, BaseModel):
        return f"data: {obj.model_dump_json(exclude_none=False)}\n\n"
    return f"data: {json.dumps(obj)}\n\n"


class RenderedRequest(OpenAIBaseModel):
    """One token-in request as ``/v1/completions/render`` (a list of them) and ``/v1/chat/completions/render``
    return it: the ids the server would compute and the sampling parameters (vLLM's ``GenerateRequest``)."""

    request_id: str
    token_ids: list[int]
    sampling_params: dict[str, JsonValue]
    model: str
    stream: bool = False
    stream_options: dict[str, JsonValue] | None = None
    cache_salt: str | None = None
    token_offsets: list[tuple[int, int]] | None = None
