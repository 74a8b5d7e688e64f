"""OpenAI-compatible HTTP request/response models, shared by the replica server and the router.

Torch-free (pydantic only), so the router can import it. Requests are validated once at the
edge; ``to_sampling_params`` turns a request into the engine's ``SamplingParams`` and raises
``ProtocolError`` (an HTTP status plus an OpenAI-shaped error body) with a message that says
what was wrong and what to do.

    error body (every 4xx/5xx):  {"error": {"message": str, "type": str, "param": str|None, "code": int}}
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from kvmesh.replica.sampling_params import MAX_LOGPROBS
from pydantic import BaseModel, ConfigDict, Field, ValidationError

# ---------------------------------------------------------------- errors

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "invalid_request_error",
    500: "internal_server_error",
    503: "service_unavailable",
}


class ProtocolError(Exception):
    """A request that cannot be served, with the HTTP status to answer it with."""

    def __init__(self, message: str, status_code: int = 400, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.param = param

    def to_dict(self) -> dict[str, Any]:
        return error_body(self.message, self.status_code, self.param)


def error_body(message: str, status_code: int = 400, param: str | None = None) -> dict[str, Any]:
    """The OpenAI-shaped error JSON (``code`` is the HTTP status, as vLLM sends it)."""
    err_type = ERROR_TYPES.get(status_code, "invalid_request_error" if status_code < 500 else "internal_server_error")
    return {"error": {"message": message, "type": err_type, "param": param, "code": status_code}}


def validation_error_message(exc: ValidationError) -> str:
    """One readable line per pydantic error: ``field: what was wrong``."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(parts)


def parse_request(model_cls: type[BaseModel], body: Any) -> Any:
    """Validate a decoded JSON body into ``model_cls``; a ProtocolError(400) on failure."""
    if not isinstance(body, dict):
        raise ProtocolError(f"request body must be a JSON object, got {type(body).__name__}")
    try:
        return model_cls.model_validate(body)
    except ValidationError as e:
        raise ProtocolError(validation_error_message(e)) from None


# ---------------------------------------------------------------- requests

MAX_CHOICES = 128
"""Most choices (n, best_of) and prompts one request may ask for (OpenAI's limit on n)."""


class OpenAIBaseModel(BaseModel):
    # Clients send fields we do not use (frequency_penalty=0, ...): accept and ignore them.
    model_config = ConfigDict(extra="ignore")


class StreamOptions(OpenAIBaseModel):
    include_usage: bool = False
    """Send a last chunk (empty choices) with the request's usage before ``[DONE]``."""
    continuous_usage_stats: bool = False
    """Attach the running usage to every chunk."""


class SamplingFields(OpenAIBaseModel):
    """Fields shared by completions and chat completions."""

    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_tokens: int = 0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    """Choices to return (each sampled independently; they share the prompt's KV blocks via the prefix cache)."""
    logit_bias: dict[str, float] | None = None
    """Token id (as a string key, as OpenAI sends it) -> bias in [-100, 100] added to its logit."""
    user: str | None = None
    cache_salt: str | None = None
    """Tenant isolation (vLLM): requests with different salts share no cached blocks."""
    request_id: str | None = None

    def _max_tokens(self) -> int | None:
        raise NotImplementedError

    def check_supported(self) -> None:
        """Refuse what the engine does not do, with a clear 400."""
        if not 1 <= self.n <= MAX_CHOICES:
            raise ProtocolError(f"n must be in [1, {MAX_CHOICES}], got {self.n}", param="n")
        if self.seed is not None and not -(2**63) <= self.seed < 2**64:
            raise ProtocolError(f"seed must fit in 64 bits, got {self.seed}", param="seed")
        if self.cache_salt is not None and not self.cache_salt:
            raise ProtocolError("cache_salt must be a non-empty string when given", param="cache_salt")

    def _logprobs(self) -> tuple[int | None, int | None]:
        """(logprobs, prompt_logprobs) of the engine's SamplingParams."""
        return None, None

    def _logit_bias(self) -> dict[int, float] | None:
        if not self.logit_bias:
            return None
        bias = {}
        for key, value in self.logit_bias.items():
            try:
                bias[int(key)] = value
            except ValueError:
                raise ProtocolError(f"logit_bias keys must be token ids, got {key!r}", param="logit_bias") from None
        return bias

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def to_sampling_params(self, prompt_len: int, max_model_len: int, default_max_tokens: int | None = None):
        """``SamplingParams`` for a prompt of ``prompt_len`` tokens on a ``max_model_len`` context."""
        from kvmesh.replica.sampling_params import SamplingParams

        self.check_supported()
        if prompt_len < 1:
            raise ProtocolError("prompt is empty; send at least one token", param="prompt")
        room = max_model_len - prompt_len
        if room < 1:
            raise ProtocolError(
                f"prompt has {prompt_len} tokens; model context is {max_model_len} tokens "
                f"(no room left to generate). Shorten the prompt.",
                param="prompt",
            )
        max_tokens = self._max_tokens()
        if max_tokens is None:
            max_tokens = room if default_max_tokens is None else min(default_max_tokens, room)
        if max_tokens < 1:
            raise ProtocolError(f"max_tokens must be >= 1, got {max_tokens}", param="max_tokens")
        if prompt_len + max_tokens > max_model_len:
            raise ProtocolError(
                f"prompt has {prompt_len} tokens; model context is {max_model_len} "
                f"(max_tokens={max_tokens} needs {prompt_len + max_tokens}). "
                f"Lower max_tokens to at most {room} or shorten the prompt.",
                param="max_tokens",
            )
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        logprobs, prompt_logprobs = self._logprobs()
        try:
            return SamplingParams(
                max_tokens=max_tokens,
                temperature=1.0 if self.temperature is None else float(self.temperature),
                top_p=1.0 if self.top_p is None else float(self.top_p),
                top_k=-1 if self.top_k in (None, 0) else int(self.top_k),
                seed=self.seed,
                stop=stop,
                stop_token_ids=list(self.stop_token_ids or []),
                ignore_eos=self.ignore_eos,
                min_tokens=self.min_tokens,
                logprobs=logprobs,
                prompt_logprobs=prompt_logprobs,
                logit_bias=self._logit_bias(),
            )
        except (ValueError, TypeError) as e:
            raise ProtocolError(f"bad sampling parameters: {e}") from None


Prompt = str | list[int] | list[str] | list[list[int]]


class CompletionRequest(SamplingFields):
    prompt: Prompt
    max_tokens: int | None = 16
    """OpenAI's default for completions is 16."""
    logprobs: int | None = None
    """Return the logprobs of the chosen tokens and of this many most likely ones per position."""
    echo: bool = False
    """Return the prompt before the completion (with its logprobs when ``logprobs`` is set)."""
    best_of: int | None = None
    """Sample this many choices and return the ``n`` with the highest cumulative logprob (not streamable)."""
    suffix: str | None = None

    def _max_tokens(self) -> int | None:
        return 1 if self.prompt_only else self.max_tokens  # the engine samples one token; it is not returned

    @property
    def prompt_only(self) -> bool:
        """``echo`` with ``max_tokens: 0``: only the prompt (and its logprobs) comes back, as in vLLM."""
        return self.echo and self.max_tokens == 0

    def _logprobs(self) -> tuple[int | None, int | None]:
        return self.logprobs, self.logprobs if self.echo else None  # vLLM: echo + logprobs -> prompt logprobs

    def check_supported(self) -> None:
        super().check_supported()
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise ProtocolError(f"logprobs must be in [0, {MAX_LOGPROBS}], got {self.logprobs}", param="logprobs")
        if self.best_of is not None:
            if not self.n <= self.best_of <= MAX_CHOICES:
                raise ProtocolError(f"best_of must be in [n={self.n}, {MAX_CHOICES}], got {self.best_of}",
                                    param="best_of")
            if self.stream and self.best_of > self.n:
                raise ProtocolError("best_of > n cannot be streamed; send stream=false", param="best_of")
        if self.suffix:
            raise ProtocolError("suffix is not supported by this server; leave it unset", param="suffix")

    def single_prompt(self) -> str | list[int]:
        """The request's first prompt (what a router routes a batch of prompts by)."""
        return self.prompt_list()[0]

    def prompt_list(self) -> list[str | list[int]]:
        """Every prompt of the request: one string or token list, or a batch of them (choices are
        numbered prompt by prompt: prompt i's j-th choice has index i * n + j, as vLLM does)."""
        p = self.prompt
        prompts = p if isinstance(p, list) and p and not isinstance(p[0], int) else [p]
        if len(prompts) > MAX_CHOICES:
            raise ProtocolError(f"a batch of {len(prompts)} prompts is too large; send at most {MAX_CHOICES}",
                                param="prompt")
        for prompt in prompts:
            if isinstance(prompt, list) and not prompt:
                raise ProtocolError("prompt is empty; send at least one token", param="prompt")
            if isinstance(prompt, list) and any(t < 0 for t in prompt):
                raise ProtocolError("prompt token ids must be non-negative", param="prompt")
        return prompts


class ChatMessage(OpenAIBaseModel):
    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None

    def text(self) -> str:
        """The message's text (content parts of type "text" are joined; other kinds are refused)."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        texts = []
        for part in self.content:
            if part.get("type") != "text":
                raise ProtocolError(
                    f"content part of type {part.get('type')!r} is not supported; send text only",
                    param="messages",
                )
            texts.append(str(part.get("text", "")))
        return "\n".join(texts)

    def to_template_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.name:
            d["name"] = self.name
        return d


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    """Deprecated by OpenAI in favour of ``max_completion_tokens``; either is accepted."""
    max_completion_tokens: int | None = None
    logprobs: bool = False
    """Return the logprobs of the chosen tokens."""
    top_logprobs: int | None = None
    """And of this many most likely tokens per position (needs ``logprobs: true``)."""
    add_generation_prompt: bool = True
    chat_template: str | None = None
    tools: list[dict[str, Any]] | None = None
    response_format: dict[str, Any] | None = None

    def _max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def _logprobs(self) -> tuple[int | None, int | None]:
        return (self.top_logprobs or 0) if self.logprobs else None, None

    def check_supported(self) -> None:
        super().check_supported()
        if self.top_logprobs is not None:
            if not 0 <= self.top_logprobs <= MAX_LOGPROBS:
                raise ProtocolError(f"top_logprobs must be in [0, {MAX_LOGPROBS}], got {self.top_logprobs}",
                                    param="top_logprobs")
            if self.top_logprobs and not self.logprobs:
                raise ProtocolError("top_logprobs needs logprobs: true", param="top_logprobs")
        if self.tools:
            raise ProtocolError("tools (function calling) are not supported by this server; leave them unset",
                                param="tools")
        if self.response_format and self.response_format.get("type", "text") != "text":
            raise ProtocolError("only response_format {'type': 'text'} is supported (no JSON mode)",
                                param="response_format")

    def template_messages(self) -> list[dict[str, Any]]:
        return [m.to_template_dict() for m in self.messages]


class TokenizeRequest(OpenAIBaseModel):
    """``POST /tokenize``: either ``prompt`` (completion rules) or ``messages`` (chat rules)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_generation_prompt: bool = True
    add_special_tokens: bool | None = None
    """None: the endpoint's rule (True for a prompt, False for messages, as vLLM)."""


class TokenizeResponse(OpenAIBaseModel):
    count: int
    max_model_len: int
    tokens: list[int]


# ---------------------------------------------------------------- responses


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class PromptTokensDetails(OpenAIBaseModel):
    cached_tokens: int = 0
    """Prompt tokens whose KV came from the prefix cache."""


class UsageInfo(OpenAIBaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> UsageInfo:
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
        )


FinishReason = Literal["stop", "length", "abort", "error"] | None


class CompletionChoice(OpenAIBaseModel):
    index: int = 0
    text: str
    logprobs: dict[str, list] | None = None
    """{tokens, token_logprobs, top_logprobs, text_offset} (replica/logprobs_format.py)."""
    finish_reason: FinishReason = None


class CompletionResponse(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: random_id("cmpl"))
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class ChatMessageOut(OpenAIBaseModel):
    role: str = "assistant"
    content: str | None = None


class ChatCompletionChoice(OpenAIBaseModel):
    index: int = 0
    message: ChatMessageOut
    logprobs: dict[str, list] | None = None
    """{content: [{token, logprob, bytes, top_logprobs}]} (replica/logprobs_format.py)."""
    finish_reason: FinishReason = None


class ChatCompletionResponse(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: random_id("chatcmpl"))
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionChoice]
    usage: UsageInfo | None = None


class DeltaMessage(OpenAIBaseModel):
    role: str | None = None
    content: str | None = None


class ChatStreamChoice(OpenAIBaseModel):
    index: int = 0
    delta: DeltaMessage
    logprobs: dict[str, list] | None = None
    finish_reason: FinishReason = None


class ChatCompletionChunk(OpenAIBaseModel):
    """One SSE chunk of a streamed chat completion (``data: {json}\\n\\n``)."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatStreamChoice]
    usage: UsageInfo | None = None


class CompletionChunk(OpenAIBaseModel):
    """One SSE chunk of a streamed completion."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class ModelCard(OpenAIBaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "kvmesh"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(OpenAIBaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class LoadReport(OpenAIBaseModel):
    """``GET /load``: what a router needs to weigh a replica (cheap to compute, polled often)."""

    num_requests_running: int
    num_requests_waiting: int
    kv_cache_usage: float
    """Fraction of KV blocks in use by requests, 0..1 (cached-but-free blocks do not count)."""
    num_waiting_prefill_tokens: int
    """Prompt tokens not yet computed, summed over waiting and running requests."""
    num_kv_blocks: int = 0
    block_size: int = 0
    timestamp: float = Field(default_factory=time.time)


SSE_DONE = "data: [DONE]\n\n"


def sse(obj: BaseModel | dict) -> str:
    """One server-sent event carrying ``obj`` as JSON."""
    if isinstance(obj, BaseModel):
        return f"data: {obj.model_dump_json(exclude_none=False)}\n\n"
    import json

    return f"data: {json.dumps(obj)}\n\n"
