"""OpenAI-shaped error responses for the FastAPI apps of the replica and the router (torch-free)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from kvmesh.replica.protocol import ProtocolError
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger(__name__)


def error_response(e: ProtocolError) -> JSONResponse:
    """``{"error": {"message", "type", "code", ...}}`` with the error's HTTP status."""
    return JSONResponse(e.to_dict(), status_code=e.status_code)


def install_error_handlers(
    app: FastAPI, server_name: str, on_error: Callable[[ProtocolError], None] | None = None
) -> None:
    """Answer every failure of ``app`` in OpenAI's error shape.

    A ``ProtocolError`` keeps its status (``on_error`` sees it first, e.g. to count it); routing
    errors of the framework (404, 405) keep theirs; anything else is a 500 that names the exception
    and is logged with its traceback, and the server keeps serving.
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
    async def internal_error(_: Request, e: Exception) -> JSONResponse:
        logger.exception("unhandled error in a %s request", server_name)
        return error_response(ProtocolError(f"internal {server_name} error: {type(e).__name__}: {e}", 500))
