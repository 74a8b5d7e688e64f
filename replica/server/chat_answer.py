"""A chat choice's text -> OpenAI's message (whole) or deltas (streamed): first the reasoning, read by the server's
``--reasoning-parser`` into ``reasoning_content``, then the answer after it, read for tool calls (chat_tools.py).

    text      <think>The user wants a city.</think>{"name": "get_weather", ...}
    message   {"reasoning_content": "The user wants a city.", "content": null, "tool_calls": [...]}

Without a reasoning parser the whole text is the answer.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvmesh.replica.openai.config import FrontendConfig
from kvmesh.replica.openai.protocol import ChatCompletionRequest, CompletionRequest
from kvmesh.replica.openai.reasoning_parsers import ReasoningStream, split
from kvmesh.replica.openai.responses import ChatMessageOut, DeltaMessage
from kvmesh.replica.openai.tool_parsers.stream import ToolCallStream
from kvmesh.replica.server import chat_tools
from kvmesh.replica.serving.sampling_params import SamplingParams


def constrain_after_reasoning(req: ChatCompletionRequest | CompletionRequest, frontend: FrontendConfig,
                              params: list[SamplingParams]) -> None:
    """A chat's constraints wait for the end of its reasoning (unless ``--enable-in-reasoning``)."""
    if isinstance(req, ChatCompletionRequest) and not frontend.enable_in_reasoning:
        req.constrain_after_reasoning(frontend.reasoning_parser, params)


def waits_for_reasoning(req: ChatCompletionRequest, frontend: FrontendConfig) -> bool:
    """The answer's content is the output of a constraint that starts where the reasoning ends (a structured output
    or a forced tool call, unless ``--enable-in-reasoning``): the reasoning parser reads it as the engine did."""
    return not frontend.enable_in_reasoning and (req.sends_constraint
                                                 or req.effective_tool_choice in ("named", "required"))


def message(req: ChatCompletionRequest, frontend: FrontendConfig, text: str,
            reason: str | None) -> tuple[ChatMessageOut, str | None]:
    """The message of a finished choice and its finish reason."""
    echo = req.echo_text()
    parser = req.reasoning_parser(frontend.reasoning_parser, waits_for_reasoning(req, frontend))
    if parser is None:
        return chat_tools.message(req, frontend.tool_call_parser, echo, text, reason)
    reasoning, content = split(parser, text)
    out, reason = chat_tools.message(req, frontend.tool_call_parser, echo, content or "", reason)
    if content is None and not echo and not out.tool_calls:
        out.content = None  # vLLM's answer that ends with its reasoning
    if req.include_reasoning:
        out.with_reasoning(reasoning)
    return out, reason


@dataclass(slots=True)
class ChoiceStream:
    """What reads one streamed choice: its reasoning (None: no reasoning parser) and its tool calls (None: text)."""

    reasoning: ReasoningStream | None
    tools: ToolCallStream | None


def streams(req: ChatCompletionRequest, frontend: FrontendConfig, n: int) -> list[ChoiceStream]:
    """One reader per streamed choice."""
    tools = chat_tools.streams(req, frontend.tool_call_parser, n)
    constrained = waits_for_reasoning(req, frontend)
    return [ChoiceStream(None if (parser := req.reasoning_parser(frontend.reasoning_parser, constrained)) is None
                         else ReasoningStream(parser), tools[i]) for i in range(n)]


def delta(req: ChatCompletionRequest, stream: ChoiceStream, text: str,
          reason: str | None) -> tuple[DeltaMessage | None, str | None]:
    """A streamed choice's next delta and finish reason; None when the readers hold the text back."""
    if stream.reasoning is None:
        return chat_tools.delta(req, stream.tools, text, reason)
    reasoning, content = stream.reasoning.feed(text, final=reason is not None)
    out: DeltaMessage | None = None
    if content or reason is not None:
        out, reason = chat_tools.delta(req, stream.tools, content, reason)
    if reasoning and req.include_reasoning:
        out = out or DeltaMessage()
        out.with_reasoning(reasoning)
    return out, reason
