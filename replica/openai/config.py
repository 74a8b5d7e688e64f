"""How the OpenAI front end (router or replica) reads, renders and limits requests, and the one rule for API keys."""

from __future__ import annotations

import os
from dataclasses import dataclass

from kvmesh.replica.openai.reasoning_parsers import REASONING_PARSERS
from kvmesh.replica.openai.tool_parsers import TOOL_PARSERS
from kvmesh.replica.serving.structured_outputs import MAX_SCHEMA_DEPTH

MIN_API_KEY_CHARS = 8


@dataclass(frozen=True, slots=True)
class FrontendConfig:
    """Limits and trust settings of one HTTP front end (vLLM's frontend arguments where they exist)."""

    max_body_bytes: int = 32 << 20
    """Largest request body accepted: a larger Content-Length, or more bytes while reading, is a 413."""
    max_prompt_chars: int = 1 << 20
    """Most characters of prompt text (all messages together, their tool calls' names and arguments too) tokenized
    per request (400 above)."""
    max_grammar_chars: int = 64 << 10
    """Most characters of one request's regex, grammar, JSON schema (as compact JSON), ``choice`` strings (together)
    or tools' parameters (together): what the replica compiles into a grammar (400 above)."""
    max_choices: int = 1000
    """Most strings in a request's ``choice`` list (400 above; OpenAI's limit on a schema's enum values)."""
    max_schema_depth: int = MAX_SCHEMA_DEPTH
    """Most levels of objects and arrays a request's JSON schema (or a tool's parameters) may nest (400 above)."""
    max_tools: int = 128
    """Most tools one chat request may send (400 above; OpenAI's limit)."""
    render_timeout_s: float = 5.0
    """Seconds tokenizing and chat-template rendering of one request may take before it is refused (400)."""
    chat_template: str | None = None
    """Jinja chat template (or a path to one) for models that ship none; None refuses chat for them (vLLM). A value
    without ``{``, ``}`` or a newline is a path, and must name a readable file (vLLM's rule)."""
    trust_request_chat_template: bool = False
    """Accept a ``chat_template`` sent in a request (vLLM's ``--trust-request-chat-template``); off: 400."""
    max_header_bytes: int = 64 << 10
    """Most bytes of one request head (request line and headers) read; past it a 431 at once, before any key is
    checked (h11, vLLM's other uvicorn parser, stops at 16 KiB; nginx at 4 x 8 KiB)."""
    max_headers: int = 100
    """Most header lines in one request; past it a 431 at once (Apache's LimitRequestFields, gunicorn's)."""
    max_request_line_bytes: int = 8 << 10
    """Longest request target (path and query); past it a 414 at once (Apache's LimitRequestLine, nginx's 8 KiB)."""
    header_timeout_s: float = 10.0
    """Seconds a connection may take to send a request's headers before it is closed (slowloris)."""
    body_timeout_s: float = 30.0
    """Seconds a request's body may take to arrive in full (408 after)."""
    keep_alive_s: float = 30.0
    """Seconds an idle keep-alive connection stays open."""
    render_threads: int = 4
    """Threads that tokenize, render templates and parse large bodies off the event loop."""
    enable_auto_tool_choice: bool = False
    """Serve ``tool_choice: "auto"`` (the default when a chat sends tools): calls read from the text by
    tool_call_parser (vLLM's --enable-auto-tool-choice). Off: such requests are a 400 naming the flags."""
    tool_call_parser: str | None = None
    """How tool calls are written in the model's text: "hermes" or "llama3_json" (vLLM's --tool-call-parser)."""
    responses_max_bytes_per_tenant: int = 64 << 20
    """Bytes of stored responses (with their conversations) one tenant may hold; its least recently used go first."""
    responses_max_bytes: int = 512 << 20
    """Bytes of stored responses of all tenants together; the least recently used of any tenant go first."""
    responses_max_age_s: float = 24 * 3600.0
    """Seconds a stored response stays unused (not stored, read or continued) before it is dropped."""
    responses_max_expired_per_tenant: int = 10_000
    """Stored responses gone for a bound (age, bytes) whose owner is still told they expired rather than 404 not
    found, per tenant (each note kept as long as a response would be); older notes go first."""
    reasoning_parser: str | None = None
    """How the model writes its reasoning: "deepseek_r1" or "qwen3" (vLLM's --reasoning-parser); chat answers carry
    it as reasoning_content, their content, tool calls and structured outputs being the answer after it."""
    enable_in_reasoning: bool = False
    """Structured outputs constrain the reasoning too, not only the answer after it (vLLM's
    structured_outputs_config.enable_in_reasoning)."""

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_prompt_chars", "render_threads", "max_header_bytes", "max_headers",
                     "max_request_line_bytes", "responses_max_bytes_per_tenant", "responses_max_bytes",
                     "responses_max_expired_per_tenant",
                     "max_grammar_chars", "max_choices", "max_schema_depth", "max_tools"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.tool_call_parser is not None and self.tool_call_parser not in TOOL_PARSERS:
            raise ValueError(f"tool_call_parser {self.tool_call_parser!r} is not known; use one of "
                             f"{', '.join(TOOL_PARSERS)}")
        if self.reasoning_parser is not None and self.reasoning_parser not in REASONING_PARSERS:
            raise ValueError(f"reasoning_parser {self.reasoning_parser!r} is not known; use one of "
                             f"{', '.join(REASONING_PARSERS)}")
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ValueError("enable_auto_tool_choice needs tool_call_parser (how the model writes its calls)")
        if self.chat_template is not None:
            check_chat_template(self.chat_template)
        for name in ("render_timeout_s", "header_timeout_s", "body_timeout_s", "keep_alive_s", "responses_max_age_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


TEMPLATE_CHARS = "{}\n"
"""A chat_template value holding any of these is template text; without them it is a path (vLLM's JINJA_CHARS)."""


def check_chat_template(value: str) -> None:
    """ValueError when ``value`` looks like a path (none of TEMPLATE_CHARS) and names no readable file: a mistyped
    path would otherwise become the template, every prompt its own text."""
    if any(c in value for c in TEMPLATE_CHARS):
        return
    if os.path.isdir(value):
        raise ValueError(f"chat_template {value!r} is a directory, not a template file; give the .jinja file in it")
    try:
        with open(value, "rb"):
            pass
    except OSError as e:
        raise ValueError(f"chat_template {value!r} looks like a file path (it has no '{{', '}}' or newline of a "
                         f"template), but it cannot be read from {os.getcwd()}: "
                         f"{'no such file' if isinstance(e, FileNotFoundError) else e.strerror}; give an existing "
                         "template file, or the template text itself") from None


def check_internal_key(key: str | None, what: str, others: dict[str, str | None]) -> None:
    """The internal key: an API key's rule, and none of the ``others`` (name -> key), which tenants or the
    operator hold."""
    check_api_key(key, what)
    for name, other in others.items():
        if key is not None and key == other:
            raise ValueError(f"{what} equals {name}: whoever holds {name} would reach the KV plane; use another secret")


def check_api_key(key: str | None, what: str) -> None:
    """The one rule for API keys, router and replicas alike: unset, or at least 8 characters."""
    if key is not None and len(key) < MIN_API_KEY_CHARS:
        raise ValueError(f"{what} has {len(key)} characters; use a secret of at least {MIN_API_KEY_CHARS} "
                         "(e.g. `python -c 'import secrets; print(secrets.token_urlsafe(24))'`) or leave it unset")
