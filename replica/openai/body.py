"""Reading a JSON request body with its limits applied while it arrives.

``Content-Length`` is checked first (a 200 MB body is refused before one byte is read), then the
bytes are counted as they stream in (chunked bodies, lying lengths), and the whole body must
arrive within ``body_timeout_s`` (slow senders get a 408). JSON is decoded with msgspec, which
refuses what Python's ``json`` accepts and nothing downstream can handle: NaN/Infinity, lone UTF-16
surrogates (``"\\ud800"``), invalid UTF-8, nesting beyond the recursion limit. Bodies above
``_INLINE_BYTES`` are decoded and validated off the event loop (and a router's upstream body of one encoded there), and
the heap they
leave is trimmed (heap_trim.py).
"""

from __future__ import annotations

import asyncio
import functools
import re
from collections.abc import Awaitable, Callable
from typing import TypeVar

import msgspec
from fastapi import Request
from kvmesh.replica.openai.config import FrontendConfig
from kvmesh.replica.openai.errors import parse_checked, parse_request
from kvmesh.replica.openai.heap_trim import after_large_body
from kvmesh.replica.serving.errors import ProtocolError, echo
from kvmesh.replica.serving.json_types import JSONObject
from pydantic import BaseModel, JsonValue
from starlette.requests import ClientDisconnect

M = TypeVar("M", bound=BaseModel)
Offload = Callable[..., Awaitable[M]]
"""Runs a function off the event loop (``PromptRenderer.run``)."""
_INLINE_BYTES = 64 << 10
"""Bodies up to this size are parsed on the loop (a thread hop costs more than parsing them)."""


async def read_body(http: Request, config: FrontendConfig, limit: int | None = None) -> bytes:
    """The raw body, or a ProtocolError: 413 over ``limit`` (None: ``max_body_bytes``), 408 slower than
    ``body_timeout_s``."""
    limit = config.max_body_bytes if limit is None else limit
    declared = http.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise ProtocolError(f"Content-Length {echo(repr(declared), 40)} is not a byte count")
        if int(declared) > limit:
            raise ProtocolError(f"request body has {declared} bytes; the limit is {limit}", 413)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + config.body_timeout_s
    chunks, size = [], 0
    stream = http.stream()
    while True:
        try:
            chunk = await asyncio.wait_for(stream.__anext__(), max(0.0, deadline - loop.time()))
        except StopAsyncIteration:
            break
        except asyncio.TimeoutError:
            raise ProtocolError(f"request body did not arrive within {config.body_timeout_s}s", 408) from None
        except ClientDisconnect:
            raise ProtocolError("client disconnected while sending the body", 499) from None
        size += len(chunk)
        if size > limit:
            raise ProtocolError(f"request body has more than {limit} bytes; the limit is {limit}", 413)
        chunks.append(chunk)
    return b"".join(chunks)


def decode_json(raw: bytes) -> JsonValue:
    """JSON -> Python objects; a ProtocolError(400) that says why for anything malformed."""
    try:
        return msgspec.json.decode(raw)
    except RecursionError:
        raise ProtocolError("request body is nested too deeply") from None
    except (msgspec.DecodeError, UnicodeDecodeError) as e:
        raise ProtocolError(f"request body is not valid JSON: {echo(str(e))}") from None


def parse_body(raw: bytes, model_cls: type[M]) -> M:
    """Decode ``raw`` and validate it into ``model_cls``."""
    return parse_request(model_cls, decode_json(raw))


async def read_request(http: Request, model_cls: type[M], config: FrontendConfig, offload: Offload[M],
                       limit: int | None = None) -> M:
    """Read (at most ``limit`` bytes; None: ``max_body_bytes``), decode and validate a body into ``model_cls``;
    large bodies are decoded by ``offload`` (``PromptRenderer.run``) so the loop stays free."""
    return await parse_off_loop(await read_body(http, config, limit), model_cls, offload)


async def parse_off_loop(raw: bytes, model_cls: type[M], offload: Offload[M]) -> M:
    """``parse_body``, on the loop for small bodies and through ``offload`` for large ones."""
    return (await decode_off_loop(raw, model_cls, offload))[1]


def decode_body(raw: bytes, model_cls: type[M],
                in_range: type[list[int]] | None = None) -> tuple[JSONObject, M, dict[str, list[int]]]:
    """``parse_body``, with the JSON object it validated (every field the client sent, unknown ones too) and the
    token-id fields ``in_range`` took (``errors.parse_checked``). A completion's one list of token ids in range is
    decoded and range-checked in one pass, and the object keeps it as sent (``msgspec.Raw``: encoded again as it
    came, not rebuilt from a thousand ints, and holding only its own bytes); any other body, a malformed one too, is
    decoded as a whole."""
    fast = _decode_id_prompt(raw, in_range) if in_range is not None and "prompt" in model_cls.__token_id_fields__ \
        and _ID_PROMPT.match(raw, max(raw.find(b'"prompt"'), 0)) else None
    if fast is None:
        body = decode_json(raw)
        return body, *parse_checked(model_cls, body, in_range)  # parse_checked refuses anything but an object
    body, sent = fast
    req, checked = parse_checked(model_cls, body, in_range, given=("prompt",))
    return {**body, "prompt": sent}, req, checked


_ID_PROMPT = re.compile(rb'"prompt"\s*:\s*\[\s*\d')
"""What a body whose prompt is token ids has where ``"prompt"`` first appears (a hint: ``_decode_id_prompt``
decides; a body it misses is decoded as a whole)."""
_FIELDS = msgspec.json.Decoder(dict[str, msgspec.Raw])
_ANY = msgspec.json.Decoder()


@functools.lru_cache(maxsize=8)
def _ids_decoder(in_range: type[list[int]]) -> msgspec.json.Decoder:
    return msgspec.json.Decoder(in_range)


def _decode_id_prompt(raw: bytes, in_range: type[list[int]]) -> tuple[JSONObject, msgspec.Raw] | None:
    """(the object with its ``prompt`` decoded as ids of ``in_range``, the prompt as sent) when ``raw`` is an object
    whose prompt is a non-empty list of such ids; None otherwise (``decode_json`` then decodes it, or says why not)."""
    try:
        fields = _FIELDS.decode(raw)
        sent, ids = fields.get("prompt"), _ids_decoder(in_range)
        body = {key: ids.decode(value) if key == "prompt" else _ANY.decode(value) for key, value in fields.items()}
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):  # ValidationError is a DecodeError
        return None
    return (body, sent.copy()) if body.get("prompt") else None  # copy: its own bytes, not a view of all of raw


async def decode_off_loop(raw: bytes, model_cls: type[M], offload: Offload[M],
                          in_range: type[list[int]] | None = None) -> tuple[JSONObject, M, dict[str, list[int]]]:
    """``decode_body``, on the loop for small bodies and through ``offload`` for large ones."""
    if len(raw) <= _INLINE_BYTES:
        return decode_body(raw, model_cls, in_range)
    after_large_body(len(raw), offload)  # what it is decoded into is handed back soon after (heap_trim.py)
    return await offload(decode_body, raw, model_cls, in_range)


async def encode_off_loop(body: JSONObject, size: int, offload: Offload) -> bytes:
    """``body`` as JSON bytes, encoded through ``offload`` when the body it came from had more than
    ``_INLINE_BYTES`` (``size``), as it was decoded."""
    if size <= _INLINE_BYTES:
        return msgspec.json.encode(body)
    return await offload(msgspec.json.encode, body)
