"""OpenAI-shaped errors and the error handlers of the replica's and the router's FastAPI apps.

    error body (every 4xx/5xx):  {"error": {"message": str, "type": str, "param": str|None, "code": int}}
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

import msgspec
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from kvmesh.replica.openai.responses import OpenAIBaseModel
from kvmesh.replica.serving.errors import ProtocolError, echo, internal_error
from pydantic import JsonValue, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger(__name__)
M = TypeVar("M", bound=OpenAIBaseModel)


def validation_error_message(exc: ValidationError) -> str:
    """One readable line per pydantic error: ``field: what was wrong``."""
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        parts.append(f"{echo(loc)}: {echo(err.get('msg', 'invalid'))}")
    return "invalid request: " + "; ".join(parts)


def validation_error_param(exc: ValidationError) -> str | None:
    """The top-level field of the first pydantic error (OpenAI's ``param``), None when it is the body itself."""
    loc = [p for p in (exc.errors()[:1] or [{}])[0].get("loc", ()) if p != "body"]
    return echo(loc[0]) if loc and isinstance(loc[0], str) else None


_TOKEN_IDS = list[int]


def _token_ids(value: JsonValue, in_range: type[list[int]] | None) -> tuple[list[int] | None, bool]:
    """(``value`` when it is a non-empty list of JSON integers (no bools, floats or strings), checked in C, else None;
    whether ``in_range`` (a ``Tokenizer.token_ids_type``) took it too: then a copy, both checks in one pass)."""
    if value.__class__ is not list or not value or value[0].__class__ is not int:
        return None, False
    for kind in (in_range, _TOKEN_IDS) if in_range is not None else (_TOKEN_IDS,):
        try:
            ids = msgspec.convert(value, kind, strict=True)
        except msgspec.ValidationError:
            continue
        return (ids, True) if kind is in_range else (value, False)
    return None, False


def parse_request(model_cls: type[M], body: JsonValue) -> M:
    """Validate a decoded JSON body into ``model_cls``; a ProtocolError(400) on failure (``parse_checked``)."""
    return parse_checked(model_cls, body)[0]


def parse_checked(model_cls: type[M], body: JsonValue, in_range: type[list[int]] | None = None,
                  given: tuple[str, ...] = ()) -> tuple[M, dict[str, list[int]]]:
    """``parse_request``, with the token-id fields whose ids ``in_range`` (a ``Tokenizer.token_ids_type``) took:
    their values on the model, range-checked (that tokenizer's ``render_completion`` would return them as they are).
    ``given``: fields of ``body`` already decoded as such ids (body.py).

    Fields the model names in ``__token_id_fields__`` skip pydantic when they hold a plain list of integers
    (a 1,000-token prompt costs pydantic ~30 µs, msgspec's C check ~3): the model is validated with a
    one-token stand-in and gets the list after, so errors and results are pydantic's either way."""
    if not isinstance(body, dict):
        raise ProtocolError(f"request body must be a JSON object, got {type(body).__name__}")
    ids, checked = {}, {}
    for name in model_cls.__token_id_fields__:
        value, took = (body[name], True) if name in given else _token_ids(body.get(name), in_range)
        if value is not None:
            ids[name] = value
            if took:
                checked[name] = value
    try:
        if not ids:
            return model_cls.model_validate(body), checked
        req = model_cls.model_validate({**body, **{name: [0] for name in ids}})
        for name, value in ids.items():
            setattr(req, name, value)
        return req, checked
    except ValidationError as e:
        raise ProtocolError(validation_error_message(e), param=validation_error_param(e)) from None
    except RecursionError:
        raise ProtocolError("request body is nested too deeply") from None


_CLOSE_AFTER = frozenset({408, 413})
"""Statuses sent before the body was read to the end: the connection closes (its unread rest is not a request)."""


def error_response(e: ProtocolError) -> JSONResponse:
    """``{"error": {"message", "type", "code", ...}}`` with the error's HTTP status."""
    headers = {"Connection": "close"} if e.status_code in _CLOSE_AFTER else None
    return JSONResponse(e.to_dict(), status_code=e.status_code, headers=headers)


def install_error_handlers(
    app: FastAPI, server_name: str, on_error: Callable[[ProtocolError], None] | None = None
) -> None:
    """Answer every failure of ``app`` in OpenAI's error shape.

    A ``ProtocolError`` keeps its status (``on_error`` sees it first, e.g. to count it); routing
    errors of the framework (404, 405) keep theirs; anything else is a 500 naming a request id, under
    which the exception is logged with its traceback (its text is not answered), and the server keeps serving.
    """

    @app.exception_handler(ProtocolError)
    async def protocol_error(_: Request, e: ProtocolError) -> JSONResponse:
        if on_error is not None:
            on_error(e)
        return error_response(e)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, e: StarletteHTTPException) -> JSONResponse:
        return error_response(ProtocolError(str(e.detail), e.status_code))

    @app.exception_handler(Exception)
    async def unhandled_error(request: Request, e: Exception) -> JSONResponse:
        return error_response(internal_error(server_name, e, logger, what=f"unhandled error in {server_name} "
                                                                           f"request {request.url.path}"))
