"""Who may call what: tenants' API key, the operator's admin key, and the few open paths.

One pure ASGI middleware (no response buffering) in front of both apps, so no handler can forget
a check:

    PUBLIC_PATHS (health, liveness, version, load, metrics)   open: probes and scrapers
    admin requests (``is_admin(method, path)``)               the admin key, never the API key;
                                                              no admin key configured -> 403 for all
    everything else                                           the API key, when one is configured

Keys are compared in constant time.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

from kvmesh.replica.openai.errors import error_response
from kvmesh.replica.serving.errors import ProtocolError
from starlette.types import ASGIApp, Receive, Scope, Send

PUBLIC_PATHS = frozenset({"/health", "/ping", "/version", "/metrics", "/load", "/get_load"})
"""Paths that reveal nothing a tenant could use and must answer probes without a key."""


def _bearer(key: str | None) -> bytes | None:
    return None if key is None else f"Bearer {key}".encode()


def never_admin(method: str, path: str) -> bool:
    return False


class AuthMiddleware:
    """The API key on every non-public path, the admin key on admin requests (see the module doc)."""

    def __init__(self, app: ASGIApp, api_key: str | None, admin_key: str | None = None,
                 is_admin: Callable[[str, str], bool] = never_admin,
                 on_refused: Callable[[ProtocolError], None] | None = None):
        self.app = app
        self.api = _bearer(api_key)
        self.admin = _bearer(admin_key)
        self.is_admin = is_admin
        self.on_refused = on_refused
        """Sees every refusal first (the router counts them in its request metric)."""

    def refusal(self, method: str, path: str, header: bytes) -> ProtocolError | None:
        """Why this request may not pass, or None."""
        if path in PUBLIC_PATHS:
            return None
        if self.is_admin(method, path):
            if self.admin is None:
                return ProtocolError(f"{method} {path} changes the replica set and the admin API is disabled: "
                                     "start the router with an admin key (admin_key) to enable it", 403)
            if not hmac.compare_digest(header, self.admin):
                return ProtocolError(f"{method} {path} needs the admin key ('Authorization: Bearer <admin key>'); "
                                     "the tenants' API key is not enough", 403)
            return None
        if self.api is not None and not hmac.compare_digest(header, self.api):
            return ProtocolError("missing or wrong API key; send 'Authorization: Bearer <key>'", 401)
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            header = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            err = self.refusal(scope["method"], scope["path"], header)
            if err is not None:
                if self.on_refused is not None:
                    self.on_refused(err)
                return await error_response(err)(scope, receive, send)
        await self.app(scope, receive, send)
