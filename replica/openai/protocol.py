"""OpenAI-compatible request models, shared by the replica server and the router (torch-free).

Requests are validated once at the edge; ``to_sampling_params`` (the fields both kinds share: sampling_fields.py)
turns a request into the engine's ``SamplingParams`` (a torch-free dataclass) and raises ``ProtocolError``
(errors.py) with a message that says what was wrong and what to do. Responses are in responses.py.
"""

from __future__ import annotations

from dataclasses import replace

from kvmesh.replica.openai.chat_message import ChatMessage
from kvmesh.replica.openai.reasoning_fields import ReasoningFields
from kvmesh.replica.openai.refused_fields import RefusedChatFields, RefusedCompletionFields
from kvmesh.replica.openai.sampling_fields import MAX_CHOICES, Count, Flag, SamplingFields
from kvmesh.replica.openai.tool_fields import ToolFields
from kvmesh.replica.openai.vllm_extras import ChatEcho, ChatTemplateArgs
from kvmesh.replica.serving.errors import ProtocolError, echo
from kvmesh.replica.serving.json_types import JSONObject
from kvmesh.replica.serving.sampling_params import MAX_LOGPROBS, SamplingParamsError
from kvmesh.replica.serving.structured_outputs import StructuredOutputsParams
from pydantic import Field

Prompt = str | list[Count] | list[str] | list[list[Count]]


class CompletionRequest(SamplingFields, RefusedCompletionFields):
    __token_id_fields__ = ("prompt",)  # validated in C when token ids (errors.parse_request)
    prompt: Prompt
    max_tokens: Count | None = 16
    """OpenAI's default for completions is 16."""
    logprobs: Count | None = None
    """Return the logprobs of the chosen tokens and of this many most likely ones per position."""
    echo: Flag = False
    """Return the prompt before the completion (with its logprobs when ``logprobs`` is set)."""
    best_of: Count | None = None
    """Sample this many choices and return the ``n`` with the highest cumulative logprob (not streamable)."""
    suffix: str | None = None

    def _max_tokens(self) -> int | None:
        return 1 if self.prompt_only else self.max_tokens  # the engine samples one token; it is not returned

    @property
    def prompt_only(self) -> bool:
        """``echo`` with ``max_tokens: 0``: only the prompt (and its logprobs) comes back, as in vLLM."""
        return self.echo and self.max_tokens == 0

    def _logprobs(self) -> tuple[int | None, int | None]:
        asked, echoed = self.prompt_logprobs, self.logprobs if self.echo else None
        # vLLM: echo + logprobs -> prompt logprobs (the larger of the two when both are asked for)
        return self.logprobs, asked if echoed is None else echoed if asked is None else max(asked, echoed)

    def check_kind(self) -> None:
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

    def prompts(self) -> list[str | list[int]]:
        """Every prompt of the request: a text, a list of token ids, or a list of either (choices are
        numbered prompt by prompt: prompt i's j-th choice has index i * n + j, as vLLM does)."""
        p = self.prompt
        batch = p if isinstance(p, list) and p and not isinstance(p[0], int) else [p]
        each = max(self.n, self.best_of or 1)  # sequences the engine runs per prompt
        if len(batch) * each > MAX_CHOICES:  # each takes a replica slot; admission lets a request go at one free
            field = "prompt" if each == 1 else "n" if each == self.n else "best_of"
            raise ProtocolError(f"{len(batch)} prompts x {each} choices are {len(batch) * each} sequences; send at "
                                f"most {MAX_CHOICES} per request", param=field)
        for one in batch:
            if not one:
                raise ProtocolError("prompt is empty; send at least one token", param="prompt")
        return batch

    def single_prompt(self) -> str | list[int]:
        """The request's first prompt (what a router routes a batch of prompts by)."""
        return self.prompts()[0]


class ChatCompletionRequest(ToolFields, ReasoningFields, SamplingFields, ChatEcho, ChatTemplateArgs,
                            RefusedChatFields):
    __token_id_fields__ = ("prompt_token_ids",)  # validated in C when token ids (errors.parse_request)
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Count | None = None
    """Deprecated by OpenAI in favour of ``max_completion_tokens``; either is accepted."""
    max_completion_tokens: Count | None = None
    logprobs: Flag = False
    """Return the logprobs of the chosen tokens."""
    top_logprobs: Count | None = None
    """And of this many most likely tokens per position (needs ``logprobs: true``)."""
    add_generation_prompt: Flag = True
    chat_template: str | None = None
    prompt_token_ids: list[Count] | None = None
    """(kvmesh) The chat already rendered to token ids: used instead of rendering ``messages`` (still required),
    after a range check and the usual context / max_tokens checks. A kvmesh router sets it so the replica
    does not tokenize the chat again (router/http/token_forwarding.py); ids that do not match the messages are
    the sender's choice, as with a token-id completion prompt."""

    def _max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def _logprobs(self) -> tuple[int | None, int | None]:
        return (self.top_logprobs or 0) if self.logprobs else None, self.prompt_logprobs

    def check_kind(self) -> None:
        if self.top_logprobs is not None:
            if not 0 <= self.top_logprobs <= MAX_LOGPROBS:
                raise ProtocolError(f"top_logprobs must be in [0, {MAX_LOGPROBS}], got {self.top_logprobs}",
                                    param="top_logprobs")
            if self.top_logprobs and not self.logprobs:
                raise ProtocolError("top_logprobs needs logprobs: true", param="top_logprobs")
        self.check_tools()

    def template_messages(self) -> list[JSONObject]:
        return [m.to_template_dict() for m in self.messages]

    def template_kwargs(self) -> dict:
        """``ChatTemplateArgs``' variables and the template's ``tools``."""
        return {**super().template_kwargs(), **({"tools": self.tools} if self.tools else {})}

    def structured_outputs_params(self) -> StructuredOutputsParams | None:
        """The output's constraint; with ``tool_choice`` "required" or a named function, the tools' schema, written
        into ``structured_outputs`` as ``{"json": schema}`` (vLLM's rule) where the engine reads it."""
        if self.tools is None and self.tool_choice is None:  # no tools: nothing to check or write (most chats)
            return super().structured_outputs_params()
        self.check_tools()
        schema = self.tool_schema()
        if schema is not None and self.structured_outputs != {"json": schema}:
            if other := self._constraint_fields():
                raise SamplingParamsError("tool_choice", f"tool_choice {echo(repr(self.tool_choice))} constrains "
                                          f"the output to the tools' JSON; {other[0]} cannot constrain it too")
            self.structured_outputs = {"json": schema}
        params = super().structured_outputs_params()
        return replace(params, field="tools") if schema is not None and params is not None else params

    def _constraint_fields(self) -> list[str]:
        """The fields besides the tools that constrain the output."""
        fmt = self.response_format
        given = {"structured_outputs": bool(self.structured_outputs),
                 "response_format": bool(fmt) and fmt.get("type") != "text",
                 "guided_json": self.guided_json is not None, "guided_regex": self.guided_regex is not None,
                 "guided_choice": self.guided_choice is not None, "guided_grammar": self.guided_grammar is not None}
        return [name for name, is_set in given.items() if is_set]
