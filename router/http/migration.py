"""Stream migration: a stream whose replica dies mid-way goes on from another replica (Dynamo's design).

While a stream flows the router keeps what it takes to re-create it: the prompt's token ids (the router
rendered them; without a tokenizer, the replica's first chunk says) and the output token ids streamed so
far. It asks replicas for them with vLLM's request field ``return_token_ids`` and cuts them out of the
chunks again unless the client asked too. When the upstream breaks before the end (reset, truncated, an
``abort`` finish, an error event), the router sends a continuation to another healthy replica: a token-in
``/v1/completions`` request whose prompt is prompt + output so far (mostly a prefix-cache hit), with
``max_tokens``/``min_tokens`` reduced by the tokens already sent, every sampling parameter of the stream (a
structured-output constraint resumed after the tokens already sent: ``structured_outputs.num_resumed_tokens``;
router/http/continuation.py) and the seed moved on so kvmesh's seeded sampler draws what it would have drawn
(``SamplingFields.continuation_seed``):

    client ◀── one stream (one id) ◀── router ◀── replica A: prompt → o1 o2 o3 ✗
                                               ◀── replica B: prompt o1 o2 o3 → o4 o5 … [DONE]

The continuation's tokens become chunks of the original stream (same ``id``, ``created``, ``model``,
completion or chat shape) and the router writes the one final usage. Text is exact: the router runs the
engine's own incremental detokenizer replayed over the tokens already sent, so text the first replica
held back (a possible stop string, half a UTF-8 character) is not lost and a stop string spanning the
splice is found. A router without a tokenizer passes the new replica's text on instead.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, cast

import msgspec
from kvmesh.replica.openai.responses import (
    ChatCompletionChunk,
    ChatStreamChoice,
    CompletionChoice,
    CompletionChunk,
    DeltaMessage,
    FinishReason,
    UsageInfo,
    random_id,
    sse,
)
from kvmesh.replica.serving.detokenizer import IncrementalDetokenizer
from kvmesh.router.http.continuation import SplicedLogprobs, continuation_body
from kvmesh.router.http.failures import request_error_event
from kvmesh.router.http.sse_events import (
    DATA,
    DONE,
    FINISH,
    NO_TEXT,
    PROMPT_IDS,
    SSE_FIELDS,
    TOKEN_IDS,
    id_list,
)

if TYPE_CHECKING:
    from kvmesh.replica.openai.protocol import ChatCompletionRequest, CompletionRequest
    from kvmesh.replica.serving.sampling_params import SamplingParams
    from kvmesh.replica.serving.tokenizer import Tokenizer
    from kvmesh.router.routing.model_pools import ModelPool

class MigratingStream:
    """One client stream: what went out, and how to continue it elsewhere when its replica fails."""

    def __init__(self, req: CompletionRequest | ChatCompletionRequest, chat: bool, prompt_ids: list[int],
                 tokenizer: Tokenizer | None, limit: int, params: SamplingParams | None = None,
                 reads_reasoning: bool = False) -> None:
        self.req, self.chat, self.tokenizer, self.limit = req, chat, tokenizer, limit
        self.reads_reasoning = chat and reads_reasoning
        """Its replica reads the answer's reasoning out of the text (``--reasoning-parser``): a continuation, plain
        text, would not."""
        self.params = params
        """The request's sampling parameters, validated when it came in (None: taken from ``req`` when needed)."""
        self.client_ids = bool(req.return_token_ids)
        """The client asked for token ids itself (else they are cut out of its chunks)."""
        self.prompt_ids = list(prompt_ids)
        self.steps: list[list[int]] = []
        """Output token ids per chunk sent (the detokenizer's replay follows the engine's steps)."""
        self.num_output = 0
        self.migrations = 0
        self.ids_known = True
        """Every chunk with text carried its token ids (an upstream without ``return_token_ids`` cannot migrate)."""
        self.id, self.created, self.model = "", 0, req.model or ""
        self.sent = False
        self.usage_sent = False
        self.done = False
        """``[DONE]`` went out: the stream is complete."""
        self.finish_reason: FinishReason = None
        self.broken: str | None = None
        """Why the current upstream cannot finish the stream (None while it is fine)."""
        self.invalid = False
        """The current upstream broke it by sending an event that is not SSE JSON (counted as ``invalid_sse``)."""
        self.cached_tokens = 0
        self.model_pool: ModelPool | None = None
        """The replicas its model may go to (router/routing/model_pools.py): a continuation stays in them."""
        self.priority: int | None = None
        """The priority the router granted the stream: its continuations carry it too (router/http/caller.py)."""
        self._detok: IncrementalDetokenizer | None = None
        self.logprobs = SplicedLogprobs(req, chat) if SplicedLogprobs.asked(req) else None
        """The stream's logprobs across its replicas (None: not asked)."""

    @property
    def output_ids(self) -> list[int]:
        return [t for step in self.steps for t in step]

    def can_migrate(self) -> bool:
        """Whether a failed upstream's stream may go on elsewhere: within the limit, its ids known, and not a chat
        whose text its replica reads into tool calls or reasoning (a continuation here would go on as plain text)."""
        reads_tools = self.chat and self.req.effective_tool_choice != "none"
        return (self.migrations < self.limit and bool(self.prompt_ids) and self.ids_known and not reads_tools
                and not self.reads_reasoning)

    # ---------------------------------------------------------------- the first replica: passed through
    def relay(self, event: bytes) -> bytes | None:
        """The client's copy of one event of the first replica (its token ids cut out), None to hold it."""
        if not event.startswith(DATA):
            if event.startswith(SSE_FIELDS):
                return event + b"\n\n"
            return self._invalid(event)
        if event.startswith(DONE):
            self.done = True
            return event + b"\n\n"
        if not (event.startswith(b"data: {") and event.endswith(b"}")):  # cheap: JSON objects only
            return self._invalid(event)
        if event.startswith(b'data: {"error"'):
            if request_error_event(event):  # the request's fault: the client reads it, nothing moves or counts
                self.finish_reason = "error"
                return event + b"\n\n"
            self.broken = f"sent an error: {event[len(DATA):][:300].decode(errors='replace')}"
            return None
        finish = FINISH.search(event)
        if finish is not None and finish.group(1) == b"abort":
            self.broken = "aborted the request (shutting down)"
            return None
        if not self.sent:
            self._first_chunk(event)
        found = TOKEN_IDS.search(event)
        if found is not None:
            ids = id_list(found.group(1))
            self.steps.append(ids)
            self.num_output += len(ids)
            if not self.client_ids:
                event = event[:found.start()] + event[found.end():]
        elif b'"choices":[]' in event.replace(b" ", b""):
            self.usage_sent = True
        else:
            self.ids_known = False
        if not self.client_ids and b"prompt_token_ids" in event:
            event = PROMPT_IDS.sub(b"", event, count=1)
        if finish is not None:
            self.finish_reason = cast(FinishReason, finish.group(1).decode())  # pydantic checks it in a chunk
        if self.logprobs is not None:
            self._relayed_logprobs(event)
        self.sent = True
        if finish is None and not self.client_ids and NO_TEXT.search(event) and b'"logprobs":null' in event:
            return None  # only its token ids made it a chunk, and the client asked for none (vLLM sends none)
        return event + b"\n\n"

    def _invalid(self, event: bytes) -> bytes | None:  # marks the stream broken; None: nothing goes out
        self.broken = f"sent an event that is not SSE JSON: {event[:80]!r}"
        self.invalid = True
        return None

    def _relayed_logprobs(self, event: bytes) -> None:
        try:
            choices = msgspec.json.decode(event[len(DATA):]).get("choices") or [{}]
        except msgspec.DecodeError:
            return
        self.logprobs.relayed(choices[0].get("logprobs"))

    def _first_chunk(self, event: bytes) -> None:
        try:
            chunk = msgspec.json.decode(event[len(DATA):])
        except msgspec.DecodeError:
            return
        self.id, self.created = chunk.get("id", ""), chunk.get("created", 0)
        self.model = chunk.get("model") or self.model
        choice = (chunk.get("choices") or [{}])[0]  # vLLM puts a completion's prompt ids in its choice
        prompt_ids = chunk.get("prompt_token_ids") or (choice.get("prompt_token_ids") if choice else None)
        if not self.prompt_ids and prompt_ids:
            self.prompt_ids = list(prompt_ids)

    # ---------------------------------------------------------------- continuing on another replica
    def continuation(self) -> dict[str, object] | None:
        """The body of the next continuation request, or None when no token is left to generate."""
        return continuation_body(self.req, self.chat, self.prompt_ids + self.output_ids, self.num_output,
                                 router_finds_stops=self.tokenizer is not None)

    def begin_continuation(self) -> list[bytes]:
        """Start splicing: rebuild the text state of what was sent; a chat stream not begun gets its role."""
        self.migrations += 1
        self.broken, self.invalid = None, False
        if self.tokenizer is not None and self._detok is None:
            params = self.params or self.req.to_sampling_params(len(self.prompt_ids), self.tokenizer.max_model_len)
            self._detok = IncrementalDetokenizer(self.tokenizer.hf, self.prompt_ids, params)
            for step in self.steps:  # the replica would have finished had one of these ended on a stop string
                for token in step:
                    self._detok.update(token)
                self._detok.take_delta(False)
        if self.sent:
            return []
        self.sent = True
        self.id = self.id or random_id("chatcmpl" if self.chat else "cmpl")
        self.created = self.created or int(time.time())
        return [self._chunk("", None, [], role=True)] if self.chat else []

    def splice(self, event: bytes) -> list[bytes]:
        """The client's events for one event of a continuation (in the original stream's shape)."""
        if not event.startswith(DATA) or event.startswith(DONE):
            return []
        try:
            chunk = msgspec.json.decode(event[len(DATA):])
        except msgspec.DecodeError:
            self._invalid(event)
            return []
        if "error" in chunk:
            self.broken = f"sent an error: {str(chunk['error'])[:300]}"
            return []
        usage = chunk.get("usage") or {}
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        if cached is not None:  # of the user's prompt, not of the output fed back
            self.cached_tokens = min(int(cached), len(self.prompt_ids))
        if not chunk.get("choices"):
            return []
        choice = chunk["choices"][0]
        reason = choice.get("finish_reason")
        if reason == "abort":
            self.broken = "aborted the request (shutting down)"
            return []
        ids = list(choice.get("token_ids") or [])
        text = choice.get("text", "")
        if self._detok is not None:
            ids, text, reason = self._detokenize(ids, reason)
        self.steps.append(ids)
        self.num_output += len(ids)
        logprobs = None if self.logprobs is None else self.logprobs.spliced(choice.get("logprobs"), len(ids))
        out = [self._chunk(text, reason, ids, logprobs)] if text or reason or (self.client_ids and ids) or logprobs \
            else []
        if reason is not None:
            out += self.finish(reason, text_sent=True)
        return out

    def _detokenize(self, ids: list[int], reason: str | None) -> tuple[list[int], str, str | None]:
        # the replica got no stop strings, so its "stop" is a stop token: its text is not output (vLLM's rule)
        silent = reason == "stop" and not self.req.include_stop_str_in_output
        for i, token in enumerate(ids[:-1] if silent else ids):
            if self._detok.update(token) is not None:
                return ids[:i + 1], self._detok.take_delta(True), "stop"
        return ids, self._detok.take_delta(reason is not None), reason

    def finish(self, reason: FinishReason, text_sent: bool = False) -> list[bytes]:
        """The end of the stream: the finish chunk (unless sent), the usage if asked, ``[DONE]``."""
        self.finish_reason, self.done = reason, True
        out = []
        if not text_sent:
            tail = self._detok.take_delta(True) if self._detok is not None else ""
            out.append(self._chunk(tail, reason, []))
        if self.req.include_usage and not self.usage_sent:
            out.append(self._encode(self._shape([], self._usage())))
        return out + [DONE + b"\n\n"]

    # ---------------------------------------------------------------- chunks in the original shape
    def _usage(self) -> UsageInfo:
        return UsageInfo.of(len(self.prompt_ids), self.num_output, self.cached_tokens)

    def _chunk(self, text: str, reason: FinishReason, ids: list[int], logprobs: dict | None = None,
               role: bool = False) -> bytes:
        token_ids = ids if self.client_ids else None
        choice: ChatStreamChoice | CompletionChoice
        if self.chat:
            delta = DeltaMessage(role="assistant", content=self.req.echo_text()) if role else DeltaMessage(content=text)
            choice = ChatStreamChoice(delta=delta, finish_reason=reason, token_ids=token_ids, logprobs=logprobs)
        else:
            choice = CompletionChoice(text=text, finish_reason=reason, token_ids=token_ids, logprobs=logprobs)
        so = self.req.stream_options
        return self._encode(self._shape([choice], self._usage() if so and so.continuous_usage_stats else None))

    def _shape(self, choices: list, usage: UsageInfo | None):
        cls = ChatCompletionChunk if self.chat else CompletionChunk
        return cls(id=self.id, created=self.created, model=self.model, choices=choices, usage=usage)

    @staticmethod
    def _encode(chunk) -> bytes:
        return sse(chunk).encode()
