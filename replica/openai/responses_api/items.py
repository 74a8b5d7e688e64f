"""A Responses request's input items, as the chat messages the chat template renders.

    "text"                                           one user message
    {"type": "message", "role", "content"}           a message (role user, assistant, system or developer; content a
                                                     string or text parts: input_text, output_text, refusal)
    {"type": "function_call", "call_id", "name", "arguments"}    an assistant's tool call
    {"type": "function_call_output", "call_id", "output"}        the call's answer: a ``tool`` message
    {"type": "reasoning", ...}                       dropped: earlier turns' reasoning is not rendered again (chat
                                                     templates drop it too)

An item without ``type`` and with a ``role`` is a message (OpenAI's "easy" input message). Consecutive assistant
pieces (text, calls) are one assistant message, as a chat client sends them. Anything else is a 400 naming
``input.N``.
"""

from __future__ import annotations

from kvmesh.replica.serving.errors import ProtocolError, echo
from kvmesh.replica.serving.json_types import JSONObject
from pydantic import JsonValue

ROLES = ("user", "assistant", "system", "developer")
TEXT_PARTS = ("input_text", "output_text", "text", "refusal")
"""Content parts read as text (a refusal's text is in ``refusal``)."""


def text_of(content: JsonValue, where: str) -> str:
    """A message's content as text: a string, or its text parts joined; other parts (images, files, audio) a 400."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ProtocolError(f"{where}.content must be a string or a list of content parts", param=f"{where}.content")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS:
            raise ProtocolError(f"{where}.content.{j} of type {echo(repr(kind))} is not served; this server reads "
                                f"text only ({', '.join(TEXT_PARTS)})", param=f"{where}.content.{j}")
        text = part.get("refusal" if kind == "refusal" else "text")
        if not isinstance(text, str):
            raise ProtocolError(f"{where}.content.{j} needs its text as a string", param=f"{where}.content.{j}")
        texts.append(text)
    return "".join(texts)


def _string(item: JSONObject, key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise ProtocolError(f"{where} needs {key} as a string", param=f"{where}.{key}")
    return value


def chat_messages(items: str | list[JsonValue], where: str = "input") -> list[JSONObject]:
    """``items`` (a Responses ``input``) as chat messages (module doc)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[JSONObject] = []
    for i, item in enumerate(items):
        at = f"{where}.{i}"
        if not isinstance(item, dict):
            raise ProtocolError(f"{at} must be an object (a message, function_call or function_call_output)", param=at)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ROLES:
                raise ProtocolError(f"{at}.role must be one of {', '.join(ROLES)}, got {echo(repr(role))}",
                                    param=f"{at}.role")
            text = text_of(item.get("content"), at)
            if role == "assistant":
                _assistant(messages)["content"] += text
            else:
                messages.append({"role": role, "content": text})
        elif kind == "function_call":
            call = {"id": _string(item, "call_id", at), "type": "function",
                    "function": {"name": _string(item, "name", at), "arguments": _string(item, "arguments", at)}}
            _assistant(messages).setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            output = item.get("output")
            if not isinstance(output, str | list):
                raise ProtocolError(f"{at}.output must be a string or a list of text parts", param=f"{at}.output")
            text = output if isinstance(output, str) else text_of(output, at)
            messages.append({"role": "tool", "tool_call_id": _string(item, "call_id", at), "content": text})
        elif kind != "reasoning":
            raise ProtocolError(f"{at} of type {echo(repr(kind))} is not served; send messages, function_call and "
                                "function_call_output items (built-in tools are not served)", param=f"{at}.type")
    return messages


def _assistant(messages: list[JSONObject]) -> JSONObject:
    """The assistant message the next assistant piece joins: the last message when it is the assistant's, else a new
    one."""
    if messages and messages[-1]["role"] == "assistant":
        return messages[-1]
    messages.append({"role": "assistant", "content": ""})
    return messages[-1]
