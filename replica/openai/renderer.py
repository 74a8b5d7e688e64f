"""Requests -> token ids, off the event loop and within limits (the loop does only I/O).

Tokenizing a 16 MB prompt or rendering a hostile chat template takes seconds of CPU; done on
the event loop it stalls every other request. ``PromptRenderer`` runs that work (and JSON
parsing of large bodies, see body.py) on a small thread pool -- cheap work stays on the loop, where it
costs less than the hop: token-id prompts, and text (chats rendered with the server's template) of
which at most ``_INLINE_CHARS`` characters are new to the tokenizer's cache -- after cheap checks on the loop:

    prompt text longer than ``max_prompt_chars``      -> 400 before tokenizing
    ``chat_template`` in a request, server not trusting -> 400 (vLLM's --trust-request-chat-template)
    rendering longer than ``render_timeout_s``           -> 400 (the worker thread finishes on its own)

The router and the replica both render through this class, so they compute the same ids.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from kvmesh.replica.openai.config import FrontendConfig
from kvmesh.replica.openai.protocol import ChatCompletionRequest, CompletionRequest
from kvmesh.replica.openai.tokenize_requests import DetokenizeRequest, TokenizeRequest
from kvmesh.replica.serving.errors import ProtocolError
from pydantic import JsonValue

if TYPE_CHECKING:
    from kvmesh.replica.serving.tokenizer import Tokenizer

T = TypeVar("T")
P = ParamSpec("P")
_INLINE_IDS = 4096
"""Token-id prompts up to this length are range-checked on the loop (cheaper than a thread hop)."""
_INLINE_CHARS = 2048
"""Characters of prompt text the loop may tokenize afresh per request: ~0.5 ms of work, less than the ~1 ms a
thread hop added per request in cluster/measure/benchmarks/router_frontend.py. Text whose pieces the tokenizer has
cached (router/routing/tokenize_cache.py) costs far less, so a longer prompt stays on the loop as long as at most
this many of its characters are new (``Tokenizer.encode_within``); the rest goes to the pool."""
_INLINE_MAX_CHARS = 64 << 10
"""Longer prompt text (or chats, all messages together) always goes to the pool: even splitting it into
cached pieces takes long."""
_INLINE_MESSAGES = 256
"""Chats with more messages are rendered in the pool (the template loops over every one)."""


class PromptRenderer:
    """The tokenizer (None: a router without one; it routes by load only) behind a thread pool."""

    def __init__(self, tokenizer: Tokenizer | None, config: FrontendConfig):
        self.tokenizer = tokenizer
        self.config = config
        self._pool = ThreadPoolExecutor(config.render_threads, thread_name_prefix="kvmesh-render")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)`` on the pool; a ProtocolError(400) when it takes longer than ``render_timeout_s``."""
        future = asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))
        try:
            return await asyncio.wait_for(future, self.config.render_timeout_s)
        except asyncio.TimeoutError:
            raise ProtocolError(f"rendering this request took longer than {self.config.render_timeout_s}s; "
                                "send a shorter prompt or a simpler chat template") from None

    # ------------------------------------------------------------ requests
    def require_tokenizer(self) -> Tokenizer:
        if self.tokenizer is None:
            raise ProtocolError("this server has no tokenizer; start it with --model or --tokenizer")
        return self.tokenizer

    def _check_chars(self, n: int, what: str) -> None:
        if n > self.config.max_prompt_chars:
            raise ProtocolError(f"{what} has {n} characters; the limit is {self.config.max_prompt_chars}",
                                param=what)

    def _check_template(self, chat_template: str | None) -> None:
        if chat_template is not None and not self.config.trust_request_chat_template:
            raise ProtocolError("chat_template is not allowed in requests: the server does not trust request "
                                "templates (start it with trust_request_chat_template to allow them)",
                                param="chat_template")

    async def completion(self, prompt: str | list[int], add_special_tokens: bool = True) -> list[int]:
        """Token ids of a completion prompt (text encoded with BOS unless ``add_special_tokens`` is False, ids
        range-checked)."""
        tok = self.require_tokenizer()
        if isinstance(prompt, str):
            self._check_chars(len(prompt), "prompt")
            special = add_special_tokens
            ids = tok.encode_within(prompt, special, _INLINE_CHARS) if len(prompt) <= _INLINE_MAX_CHARS else None
            return ids if ids is not None else await self.run(tok.render_completion, prompt, special)
        if len(prompt) <= _INLINE_IDS:
            return tok.render_completion(prompt)
        return await self.run(tok.render_completion, prompt)

    async def chat(self, messages: list[dict[str, JsonValue]], add_generation_prompt: bool = True,
                   chat_template: str | None = None, add_special_tokens: bool = False,
                   template_kwargs: dict[str, JsonValue] | None = None) -> list[int]:
        """Token ids of a chat: the template output encoded without special tokens (vLLM's rule), or with
        them when a /tokenize caller asks for ``add_special_tokens``. The server's template renders on the loop
        for chats up to ``_INLINE_MAX_CHARS`` / ``_INLINE_MESSAGES``, and its text is encoded there when at
        most ``_INLINE_CHARS`` of it are new to the tokenizer's cache; other work goes to the pool.
        ``template_kwargs`` are more template variables (``ChatTemplateArgs.template_kwargs``)."""
        tok = self.require_tokenizer()
        self._check_template(chat_template)
        chars = sum(_message_chars(m) for m in messages)
        chars += sum(len(str(value)) for value in (template_kwargs or {}).values())
        self._check_chars(chars, "messages")

        def text() -> str:
            try:
                return tok.apply_chat_template(messages, add_generation_prompt, chat_template, template_kwargs)
            except ProtocolError:
                raise
            except Exception as e:  # a template error is the request's fault (bad roles, ...)
                raise ProtocolError(f"cannot apply the chat template to these messages: {e}",
                                    param="messages") from None

        def render() -> list[int]:
            return tok.encode(text(), add_special_tokens=add_special_tokens)

        if chat_template is None and chars <= _INLINE_MAX_CHARS and len(messages) <= _INLINE_MESSAGES:
            rendered = text()
            if len(rendered) <= _INLINE_MAX_CHARS:
                ids = tok.encode_within(rendered, add_special_tokens, _INLINE_CHARS)
                if ids is not None:
                    return ids
            return await self.run(tok.encode, rendered, add_special_tokens)
        return await self.run(render)

    async def request(self, req: CompletionRequest | ChatCompletionRequest) -> list[int]:
        """Token ids of a completion or chat request, exactly as the replica computes them (a chat's
        ``prompt_token_ids``, when sent, range-checked instead of rendering its messages)."""
        if isinstance(req, ChatCompletionRequest):
            req.check_supported()  # an unsupported field is the answer, before any template question
            req.check_tool_choice_served(self.config.enable_auto_tool_choice, self.config.tool_call_parser)
            req.adjust_for_tool_parser(self.config.tool_call_parser)
            if req.prompt_token_ids is not None:
                self._check_template(req.chat_template)  # the same answer whether or not ids came along
                if not req.prompt_token_ids:
                    raise ProtocolError("prompt_token_ids is empty; send at least one token",
                                        param="prompt_token_ids")
                ids = await self.completion(req.prompt_token_ids)
            else:
                ids = await self.chat(req.template_messages(), req.add_generation_prompt, req.chat_template,
                                      bool(req.add_special_tokens), req.template_kwargs())
            return req.truncated(ids, self.require_tokenizer().max_model_len)
        return (await self.prompts(req, first_only=True))[0]

    async def prompts(self, req: CompletionRequest, first_only: bool = False,
                      checked: list[int] | None = None) -> list[list[int]]:
        """Token ids of every prompt of a completion request (or of its first), as the replica computes them;
        ``checked``: its prompt's ids as this tokenizer's range check returned them (``errors.parse_checked``)."""
        limit, special = self.require_tokenizer().max_model_len, req.add_special_tokens is not False
        prompts = [req.single_prompt()] if first_only else req.prompts()
        return [req.truncated(prompt if prompt is checked else await self.completion(prompt, special), limit)
                for prompt in prompts]

    async def detokenize(self, req: DetokenizeRequest) -> str:
        """``POST /detokenize``: the ids' text (special tokens kept, as vLLM); ids outside the vocabulary are a 400."""
        tok = self.require_tokenizer()
        vocab = tok.vocab_size
        bad = next((t for t in req.tokens if not 0 <= t < vocab), None)
        if bad is not None:
            raise ProtocolError(f"tokens: token id {bad} is out of range; token ids are integers in [0, {vocab})",
                                param="tokens")
        return await self.run(tok.decode, req.tokens, False)

    async def tokenize(self, req: TokenizeRequest) -> list[int]:
        """``POST /tokenize``: exactly one of ``prompt`` / ``messages``; ``add_special_tokens`` defaults to
        True for a prompt and False for messages (vLLM)."""
        if (req.prompt is None) == (req.messages is None):
            raise ProtocolError("send exactly one of 'prompt' or 'messages'", param="prompt")
        tok = self.require_tokenizer()
        if req.prompt is not None:
            self._check_chars(len(req.prompt), "prompt")
            special = req.add_special_tokens is not False
            ids = None
            if len(req.prompt) <= _INLINE_MAX_CHARS:
                ids = tok.encode_within(req.prompt, special, _INLINE_CHARS)
            return ids if ids is not None else await self.run(tok.encode, req.prompt, special)
        messages = [m.to_template_dict() for m in req.messages]
        return await self.chat(messages, req.add_generation_prompt, req.chat_template, bool(req.add_special_tokens),
                               req.template_kwargs())


def _message_chars(message: dict[str, JsonValue]) -> int:
    """Characters a message carries into the template (what ``max_prompt_chars`` bounds): its content, its reasoning,
    and each tool call's name and arguments (a call counts one at least: 100,000 empty ones are not free)."""
    n = len(str(message.get("content") or "")) + len(str(message.get("reasoning") or ""))
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            n += len(str(function.get("name") or "")) + len(str(function.get("arguments") or ""))
        n += 1
    return n
