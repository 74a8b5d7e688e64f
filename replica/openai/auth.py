"""Who may call what: tenants' API key, the operator's admin key, the cluster's internal key, the open paths.

One pure ASGI middleware (no response buffering) in front of both apps, so no handler can forget
a check:

    PUBLIC_PATHS (health, liveness, version, load, metrics)   open: probes and scrapers
    the internal key (a replica's, ``internal_key``)          every path: the router and peer replicas
    the KV plane (``is_kv_plane(path)``: a replica's /kv/*)   the internal key only, when one is configured:
                                                              none -> 401, the API or admin key -> 403
    admin requests (``is_admin(method, path)``)               the admin key, never the API key;
                                                              no admin key configured -> 403 for all
    ADMIN_READABLE (GET /v1/models)                           the API key or the admin key (the admin sees
                                                              host paths there)
    everything else, ``router_only`` (a ``kvmesh serve``      the internal key only: tenants go through the
      replica)                                                router's admission; the API key -> 403
    everything else                                           the API key, when one is configured

A request that presented the internal key has ``scope["state"]["kvmesh_internal"]`` True (False for every
other), so a handler can tell the cluster's own calls (``kv_transfer_params``: replica/server/kv_plane.py); one
that presented the internal or the admin key has ``scope["state"]["kvmesh_operator"]`` True (``is_operator``: who
may see host paths, e.g. ``/v1/models``' ``root``). Keys are compared in constant time.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Iterable

from kvmesh.replica.openai.errors import error_response
from kvmesh.replica.serving.errors import ProtocolError, echo
from starlette.types import ASGIApp, Receive, Scope, Send

PUBLIC_PATHS = frozenset({"/health", "/ping", "/version", "/metrics", "/load", "/get_load"})
"""Paths that reveal nothing a tenant could use and must answer probes without a key."""
INTERNAL_SCOPE_KEY = "kvmesh_internal"
"""``scope["state"][INTERNAL_SCOPE_KEY]``: the request presented the cluster's internal key."""
OPERATOR_SCOPE_KEY = "kvmesh_operator"
"""``scope["state"][OPERATOR_SCOPE_KEY]``: the request presented the internal key or the admin key."""
ADMIN_READABLE = frozenset({("GET", "/v1/models")})
"""Tenants' paths the admin key may read too: what they answer the operator shows more (host paths)."""
KV_PLANE_REFUSED = ("the KV plane is the cluster's own: only the router and the replicas (the internal key) may "
                    "use it; tenants' and admin keys are refused")


def _bearer(key: str | None) -> bytes | None:
    return None if key is None else f"Bearer {key}".encode()


def is_operator(scope: Scope) -> bool:
    """Whether the request of ``scope`` presented the internal or the admin key (``AuthMiddleware`` says so)."""
    return bool(scope.get("state", {}).get(OPERATOR_SCOPE_KEY))


def never_admin(method: str, path: str) -> bool:
    return False


def never_kv_plane(path: str) -> bool:
    return False



def authorization(headers: Iterable[tuple[bytes, bytes]]) -> bytes:
    """The request's one ``Authorization`` value (b"" when absent). Several are a 400: what checks a key and what
    books its tenant must read the same one (a first key checked and a last one booked let a tenant pose as
    another, or as the shared key)."""
    found = [value for name, value in headers if name == b"authorization"]
    if len(found) > 1:
        raise ProtocolError(f"{len(found)} Authorization headers; send one Authorization header", 400)
    return found[0] if found else b""

class AuthMiddleware:
    """The API key on every non-public path, the admin key on admin requests, the internal key on the KV
    plane (see the module doc)."""

    def __init__(self, app: ASGIApp, api_key: str | None, admin_key: str | None = None,
                 is_admin: Callable[[str, str], bool] = never_admin,
                 on_refused: Callable[[ProtocolError], None] | None = None,
                 internal_key: str | None = None, is_kv_plane: Callable[[str], bool] = never_kv_plane,
                 tenant_key: Callable[[bytes], bool] | None = None, router_only: bool = False):
        self.app = app
        self.api = _bearer(api_key)
        self.admin = _bearer(admin_key)
        self.internal = _bearer(internal_key)
        self.is_admin = is_admin
        self.is_kv_plane = is_kv_plane
        self.on_refused = on_refused
        """Sees every refusal first (the router counts them in its request metric)."""
        self.tenant_key = tenant_key
        """Whether an Authorization value carries one of the tenants' own keys (the router's admission keys file),
        taken like the API key; None: only the API key."""
        self.router_only = router_only
        """Only the internal key passes (a replica behind its router): the API key is known only to say why not."""

    def internal_caller(self, header: bytes) -> bool:
        """Whether ``header`` (the Authorization value) is the internal key."""
        return self.internal is not None and hmac.compare_digest(header, self.internal)

    def refusal(self, method: str, path: str, header: bytes) -> ProtocolError | None:
        """Why this request may not pass, or None."""
        if path in PUBLIC_PATHS or self.internal_caller(header):
            return None
        if self.internal is not None and self.is_kv_plane(path):
            if any(key is not None and hmac.compare_digest(header, key) for key in (self.api, self.admin)):
                return ProtocolError(f"{method} {echo(path)}: {KV_PLANE_REFUSED}", 403)
            return ProtocolError(f"{method} {echo(path)} needs the cluster's internal key; send "
                                 "'Authorization: Bearer <internal key>'", 401)
        if self.is_admin(method, path):
            if self.admin is None:
                return ProtocolError(f"{method} {echo(path)} is the admin plane (the replica set, adapters) and the "
                                     f"admin "
                                     "API is disabled: give this server an admin key (admin_key, KVMESH_ADMIN_KEY) "
                                     "to enable it", 403)
            if not hmac.compare_digest(header, self.admin):
                return ProtocolError(f"{method} {echo(path)} needs the admin key ('Authorization: Bearer <admin "
                                     f"key>'); "
                                     "the tenants' API key is not enough", 403)
            return None
        if self.router_only:
            tenant = self.api is not None and hmac.compare_digest(header, self.api)
            return ProtocolError(f"{method} {echo(path)}: this replica takes requests only from its router (the "
                                 f"cluster's "
                                 "internal key); send them to the router", 403 if tenant else 401)
        if self.api is None and self.tenant_key is None:
            return None
        if (method, path) in ADMIN_READABLE and self.admin is not None and hmac.compare_digest(header, self.admin):
            return None
        if not ((self.api is not None and hmac.compare_digest(header, self.api))
                or (self.tenant_key is not None and self.tenant_key(header))):
            return ProtocolError("missing or wrong API key; send 'Authorization: Bearer <key>'", 401)
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            try:
                header = authorization(scope["headers"])
            except ProtocolError as e:
                return await error_response(e)(scope, receive, send)
            err = self.refusal(scope["method"], scope["path"], header)
            if err is not None:
                if self.on_refused is not None:
                    self.on_refused(err)
                return await error_response(err)(scope, receive, send)
            # a fresh dict per request: a server may hand every request the same lifespan state
            internal = self.internal_caller(header)
            operator = internal or (self.admin is not None and hmac.compare_digest(header, self.admin))
            scope["state"] = {**scope.get("state", {}), INTERNAL_SCOPE_KEY: internal, OPERATOR_SCOPE_KEY: operator}
        await self.app(scope, receive, send)
