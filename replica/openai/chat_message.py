"""A chat request's message (OpenAI's shape) and its form for the chat template."""

from __future__ import annotations

import json
from typing import Literal

from kvmesh.replica.openai.responses import OpenAIBaseModel
from kvmesh.replica.serving.errors import ProtocolError, echo
from kvmesh.replica.serving.json_types import JSONObject

Role = Literal["system", "developer", "user", "assistant", "tool", "function"]
"""The chat roles OpenAI's API defines; any other is a 400 naming ``messages.N.role``."""


class ChatMessage(OpenAIBaseModel):
    role: Role
    content: str | list[JSONObject] | None = None
    name: str | None = None
    tool_calls: list[JSONObject] | None = None
    """An assistant message's calls (OpenAI's shape; rendered with their arguments as objects, as vLLM does)."""
    tool_call_id: str | None = None
    """A ``tool`` message's answer to this call."""
    reasoning: str | None = None
    """An assistant message's reasoning sent back (a reasoning model's earlier turn, vLLM's name): the template
    gets it as ``reasoning`` and ``reasoning_content`` (templates that keep the thinking of earlier turns read it)."""
    reasoning_content: str | None = None
    """The same under DeepSeek's name; ``reasoning`` wins when both are sent."""

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

    def to_template_dict(self) -> JSONObject:
        content = self.content  # read once per message per request: plain text is the usual case
        d: JSONObject = {"role": self.role, "content": content if content.__class__ is str else self.text()}
        if self.name:
            d["name"] = self.name
        if self.tool_call_id is not None:
            d["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            d["tool_calls"] = [template_tool_call(call, i) for i, call in enumerate(self.tool_calls)]
        if self.role == "assistant":
            thinking = self.reasoning if self.reasoning is not None else self.reasoning_content
            if thinking is not None:
                d["reasoning"] = d["reasoning_content"] = thinking
        return d


def template_tool_call(call: JSONObject, i: int) -> JSONObject:
    """An assistant message's tool call for the chat template: its ``function.arguments`` JSON string parsed to an
    object (templates write them with ``tojson``; vLLM parses them the same way); a 400 naming it when it is not
    JSON."""
    function = call.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ProtocolError("a tool call needs function.name", param=f"messages.tool_calls.{i}.function")
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments else {}
        except ValueError:
            raise ProtocolError(f"tool call {echo(function['name'])}'s function.arguments is not JSON",
                                param=f"messages.tool_calls.{i}.function.arguments") from None
        except RecursionError:
            raise ProtocolError(f"tool call {echo(function['name'])}'s function.arguments is nested too deeply",
                                param=f"messages.tool_calls.{i}.function.arguments") from None
    return {**call, "function": {**function, "arguments": arguments}}
