"""ProtocolError: a request that cannot be served, the OpenAI-shaped error body it answers with, and ``echo``, the
one way an error repeats a client's string (cut to ``ECHO_CHARS``).

    error body (every 4xx/5xx):  {"error": {"message": str, "type": str, "param": str|None, "code": int}}
"""

from __future__ import annotations

import logging
import secrets
from typing import TypedDict

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_server_error",
    502: "bad_gateway",
    503: "service_unavailable",
}


class ErrorDetail(TypedDict):
    """The inside of an error body."""

    message: str
    """What was wrong and what to do."""
    type: str
    """OpenAI's error type (``invalid_request_error``, ...), from the status."""
    param: str | None
    """The request field at fault, if one is."""
    code: int
    """The HTTP status."""


class ErrorBody(TypedDict):
    """The OpenAI-shaped error JSON."""

    error: ErrorDetail
    """What went wrong."""


class ProtocolError(Exception):
    """A request that cannot be served, with the HTTP status to answer it with."""

    def __init__(self, message: str, status_code: int = 400, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.param = param

    def to_dict(self) -> ErrorBody:
        return error_body(self.message, self.status_code, self.param)


ECHO_CHARS = 200
"""Most characters of a client's string (a model or adapter name, a field) that an error message repeats."""


def echo(text: object, limit: int = ECHO_CHARS) -> str:
    """``text`` (a ``str``, else its ``repr``) as an error message repeats a client's string: cut to ``limit``
    characters with an ellipsis and its length, so an error never sends a long name back whole."""
    text = text if isinstance(text, str) else repr(text)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text)} characters)"


def error_body(message: str, status_code: int = 400, param: str | None = None) -> ErrorBody:
    """The OpenAI-shaped error JSON (``code`` is the HTTP status, as vLLM sends it)."""
    err_type = ERROR_TYPES.get(status_code, "invalid_request_error" if status_code < 500 else "internal_server_error")
    return {"error": {"message": message, "type": err_type, "param": param, "code": status_code}}


def new_request_id() -> str:
    """A short id that ties an error answer to its line in the server's log."""
    return secrets.token_hex(6)


def log_failure(e: BaseException, log: logging.Logger, what: str) -> str:
    """Log ``e`` with its traceback under a fresh request id, which the answer names instead of the
    exception (whose text may carry internals: addresses, paths, library state); the id."""
    request_id = new_request_id()
    log.error("%s (request id %s): %s: %s", what, request_id, type(e).__name__, e, exc_info=e)
    return request_id


def internal_error(server_name: str, e: BaseException, log: logging.Logger,
                   what: str = "unhandled error in a request") -> ProtocolError:
    """The 500 answering a failure nobody planned for (``log_failure``): it names the request id only."""
    request_id = log_failure(e, log, what)
    return ProtocolError(f"internal {server_name} error (request id {request_id}); its log has the details", 500)
