"""A chat answer as a Response: its output items, usage, status, and the Response object around them.

    chat message {"content", "tool_calls", "reasoning"? / "reasoning_content"?}  ->  output items, in order:
        reasoning       when the chat message carries reasoning (a server with a reasoning parser: vLLM's newer
                        ``reasoning``, else ``reasoning_content``)
        message         {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text"}]}
        function_call   one per tool call: {"type": "function_call", "call_id", "name", "arguments"}
    chat usage {prompt_tokens, completion_tokens, prompt_tokens_details.cached_tokens}
        ->  {input_tokens, input_tokens_details.cached_tokens, output_tokens, output_tokens_details, total_tokens}
    finish_reason "length"  ->  status "incomplete", incomplete_details.reason "max_output_tokens", the last item
    (the one cut) "incomplete"; "abort" -> "cancelled"; "error" -> "failed" (with ``error``)
"""

from __future__ import annotations

import time
import uuid

from kvmesh.replica.serving.json_types import JSONObject
from pydantic import JsonValue

from .request import ResponsesRequest


def new_id(prefix: str) -> str:
    """An output id as OpenAI writes them (``resp_<hex>``, ``msg_<hex>``, ``fc_<hex>``)."""
    return f"{prefix}_{uuid.uuid4().hex}"


def message_item(text: str, status: str = "completed", item_id: str | None = None) -> JSONObject:
    return {"type": "message", "id": item_id or new_id("msg"), "role": "assistant", "status": status,
            "content": [text_part(text)]}


def text_part(text: str) -> JSONObject:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def reasoning_item(text: str, status: str = "completed", item_id: str | None = None) -> JSONObject:
    """The reasoning before an answer (a chat message's ``reasoning``) as OpenAI's reasoning item."""
    return {"type": "reasoning", "id": item_id or new_id("rs"), "summary": [], "status": status,
            "content": [{"type": "reasoning_text", "text": text}]}


def function_call_item(call_id: str, name: str, arguments: str, status: str = "completed",
                       item_id: str | None = None) -> JSONObject:
    return {"type": "function_call", "id": item_id or new_id("fc"), "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def reasoning_of(message: JSONObject) -> JsonValue:
    """A chat message's (or delta's) reasoning: vLLM's ``reasoning``, else the older ``reasoning_content`` (a server
    that writes both writes the same text: read once)."""
    return message.get("reasoning") or message.get("reasoning_content")


def output_items(message: JSONObject) -> list[JSONObject]:
    """A chat answer's message as output items (module doc)."""
    items: list[JSONObject] = []
    if reasoning := reasoning_of(message):
        items.append(reasoning_item(str(reasoning)))
    content = message.get("content")
    if content or not message.get("tool_calls"):
        items.append(message_item(content or ""))
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        items.append(function_call_item(call.get("id") or new_id("call"), function.get("name", ""),
                                        function.get("arguments", "")))
    return items


def assistant_message(items: list[JsonValue]) -> JSONObject:
    """Output items as the assistant's chat message (what a continuation renders): text and calls."""
    message: JSONObject = {"role": "assistant", "content": ""}
    for item in items:
        if item["type"] == "message":
            message["content"] += "".join(part["text"] for part in item["content"])
        elif item["type"] == "function_call":
            message.setdefault("tool_calls", []).append({
                "id": item["call_id"], "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]}})
    return message


def usage(chat_usage: JSONObject | None) -> JSONObject | None:
    """The chat's usage in the Responses shape (cached prompt tokens included)."""
    if not chat_usage:
        return None
    details = chat_usage.get("prompt_tokens_details") or {}
    prompt, completion = chat_usage.get("prompt_tokens", 0), chat_usage.get("completion_tokens", 0)
    return {"input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": details.get("cached_tokens", 0), "cache_write_tokens": 0},
            "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion}


FAILED_ANSWER = {"code": "server_error", "message": "the answer failed on the replica (finish_reason \"error\", e.g. a "
                 "grammar that did not compile in time); retry"}


def status_of(finish_reason: str | None) -> tuple[str, JSONObject | None]:
    """The Response's status and incomplete details for the chat's ``finish_reason`` (``abort``: cancelled,
    ``error``: failed)."""
    if finish_reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    return {"abort": "cancelled", "error": "failed"}.get(finish_reason or "", "completed"), None


def response_object(req: ResponsesRequest, response_id: str, model: str, created_at: float | None = None,
                    status: str = "in_progress") -> JSONObject:
    """The Response for ``req`` before its output (status ``in_progress``): what it asked, as OpenAI echoes it."""
    fmt = (req.text or {}).get("format") or {"type": "text"}
    return {"id": response_id, "object": "response", "created_at": created_at or int(time.time()), "status": status,
            "background": False, "error": None, "incomplete_details": None, "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens, "model": model, "output": [],
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": req.previous_response_id, "reasoning": req.reasoning or {"effort": None},
            "store": req.store, "temperature": 1.0 if req.temperature is None else req.temperature,
            "text": {"format": fmt}, "tool_choice": req.tool_choice or "auto", "tools": req.tools or [],
            "top_p": 1.0 if req.top_p is None else req.top_p, "truncation": "disabled", "usage": None,
            "user": req.user, "metadata": req.metadata or {}}


def finished(response: JSONObject, output: list[JSONObject], finish_reason: str | None,
             chat_usage: JSONObject | None) -> JSONObject:
    """``response`` with its output, usage and final status."""
    status, incomplete = status_of(finish_reason)
    if status == "incomplete" and output:
        output = [*output[:-1], {**output[-1], "status": "incomplete"}]  # the item the cut ended
    return {**response, "status": status, "incomplete_details": incomplete, "output": output,
            "error": FAILED_ANSWER if status == "failed" else None, "usage": usage(chat_usage),
            "completed_at": int(time.time()) if status == "completed" else None}


def from_chat(response: JSONObject, chat: JSONObject) -> JSONObject:
    """The finished Response of a whole chat completion answer."""
    choice = (chat.get("choices") or [{}])[0]
    return finished(response, output_items(choice.get("message") or {}), choice.get("finish_reason"),
                    chat.get("usage"))
