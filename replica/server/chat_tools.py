"""A chat answer's tool calls on the replica: its text read by the request's tool parser into OpenAI's
``message.tool_calls`` (whole) or tool-call deltas (streamed), and ``finish_reason: "tool_calls"``.

Which parser reads a request (tool_fields.py): none for ``tool_choice: "none"``, the server's
``tool_call_parser`` for "auto", the JSON of the forced calls for "required" and a named function. A
finished answer whose calls do not parse is its text, as vLLM answers it.
"""

from __future__ import annotations

from kvmesh.replica.openai.protocol import ChatCompletionRequest
from kvmesh.replica.openai.responses import ChatMessageOut, DeltaMessage
from kvmesh.replica.openai.tool_parsers.stream import ToolCallStream, answer


def finish_reason(req: ChatCompletionRequest, reason: str | None) -> str | None:
    """``"tool_calls"`` for an answer that called and stopped on its own, except with a named function (vLLM and
    OpenAI answer that one with "stop")."""
    return "tool_calls" if reason == "stop" and req.effective_tool_choice != "named" else reason


def message(req: ChatCompletionRequest, tool_call_parser: str | None, echo: str, text: str,
            reason: str | None) -> tuple[ChatMessageOut, str | None]:
    """The message of a finished choice (``echo``: the text it starts with) and its finish reason."""
    parser = req.tool_parser(tool_call_parser)
    if parser is not None:
        content, calls = answer(parser, text, req.parallel_tool_calls is not False)
        if calls:
            return ChatMessageOut(content=(echo + (content or "")) or None, tool_calls=calls), finish_reason(req,
                                                                                                          reason)
    return ChatMessageOut(content=echo + text), reason


def streams(req: ChatCompletionRequest, tool_call_parser: str | None, n: int) -> list[ToolCallStream | None]:
    """One tool-call reader per streamed choice (None each when the answer is plain text)."""
    return [None if (parser := req.tool_parser(tool_call_parser)) is None else
            ToolCallStream(parser, req.parallel_tool_calls is not False) for _ in range(n)]


def delta(req: ChatCompletionRequest, stream: ToolCallStream | None, text: str,
          reason: str | None) -> tuple[DeltaMessage | None, str | None]:
    """A streamed choice's next delta and finish reason; None when a tool-call reader holds the text back."""
    if stream is None:
        return DeltaMessage(content=text), reason
    content, calls = stream.feed(text, final=reason is not None)
    if reason is not None and stream.called:
        reason = finish_reason(req, reason)
    if not content and not calls and reason is None:
        return None, None
    return DeltaMessage(content=content if content or not calls else None, tool_calls=calls or None), reason
