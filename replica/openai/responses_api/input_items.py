"""A stored Response's input items, listed as OpenAI lists them (``GET /v1/responses/{id}/input_items``, the openai
SDK's ``responses.input_items.list``).

    stored    the request's ``input`` (items.py read it already) as OpenAI's items, each with an id:
              "text" / a message   {"type": "message", "id": "msg_...", "role", "status": "completed",
                                    "content": [{"type": "input_text", "text"}]}   (an assistant's: output_text)
              function_call        {"type": "function_call", "id": "fc_...", "call_id", "name", "arguments", "status"}
              function_call_output {"type": "function_call_output", "id": "fco_...", "call_id", "output", "status"}
              reasoning            as sent, with an id and a summary
    listed    {"object": "list", "data": [...], "first_id", "last_id", "has_more"}: ``order`` "desc" (the default:
              the last input item first) or "asc", at most ``limit`` (1-100, default 20) after the item ``after``

A request's own input only: what earlier turns sent is listed under their own responses.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvmesh.replica.serving.errors import ProtocolError, echo
from kvmesh.replica.serving.json_types import JSONObject
from pydantic import JsonValue

from .items import ROLES
from .output import new_id, text_part

DEFAULT_LIMIT, MAX_LIMIT = 20, 100
"""Items per page unless ``limit`` says, and the most it may say (OpenAI's)."""


def _parts(content: JsonValue, role: str) -> list[JsonValue]:
    """A message's content as content parts: input_text for the caller's roles, output_text for the assistant's."""
    kind = "output_text" if role == "assistant" else "input_text"
    pieces = [content] if isinstance(content, str) else content if isinstance(content, list) else []
    parts: list[JsonValue] = []
    for piece in pieces:
        if isinstance(piece, dict) and piece.get("type") == "refusal" and role == "assistant":
            parts.append({"type": "refusal", "refusal": piece.get("refusal", "")})
            continue
        text = piece if isinstance(piece, str) else piece.get("text", "") if isinstance(piece, dict) else ""
        parts.append(text_part(text) if kind == "output_text" else {"type": kind, "text": text})
    return parts


def _item(item: JsonValue) -> JSONObject:
    if isinstance(item, str):
        item = {"role": "user", "content": item}
    assert isinstance(item, dict)  # items.py refused anything else
    kind = item.get("type", "message")
    if kind == "message":
        role = item["role"] if item.get("role") in ROLES else "user"
        return {"type": "message", "id": item.get("id") or new_id("msg"), "role": role, "status": "completed",
                "content": _parts(item.get("content"), role)}
    if kind == "function_call":
        return {"type": "function_call", "id": item.get("id") or new_id("fc"), "call_id": item["call_id"],
                "name": item["name"], "arguments": item["arguments"], "status": "completed"}
    if kind == "function_call_output":
        return {"type": "function_call_output", "id": item.get("id") or new_id("fco"), "call_id": item["call_id"],
                "output": item["output"], "status": "completed"}
    return {**item, "id": item.get("id") or new_id("rs"), "summary": item.get("summary") or []}


def stored_items(input_: str | list[JsonValue] | None) -> list[JSONObject]:
    """A request's ``input`` as the items its Response lists (module doc)."""
    if input_ is None:
        return []
    return [_item(item) for item in ([input_] if isinstance(input_, str) else input_)]


def _limit(value: str | None) -> int:
    if value is None:
        return DEFAULT_LIMIT
    if not (value.isascii() and value.isdigit() and len(value) <= 3) or not 1 <= int(value) <= MAX_LIMIT:
        raise ProtocolError(f"limit must be an integer from 1 to {MAX_LIMIT}, got {echo(value, 20)}", param="limit")
    return int(value)


def list_page(items: list[JSONObject], params: Mapping[str, str]) -> JSONObject:
    """One page of ``items`` (in input order) for the query ``params`` (module doc); a 400 naming a bad one."""
    limit, order = _limit(params.get("limit")), params.get("order", "desc")
    if order not in ("asc", "desc"):
        raise ProtocolError(f"order must be 'asc' or 'desc', got {echo(order, 20)}", param="order")
    ordered = items if order == "asc" else items[::-1]
    start = 0
    if (after := params.get("after")) is not None:
        ids = [item["id"] for item in ordered]
        if after not in ids:
            raise ProtocolError(f"after: no input item {echo(after, 64)} in this response", param="after")
        start = ids.index(after) + 1
    data = ordered[start:start + limit]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": start + limit < len(ordered)}
