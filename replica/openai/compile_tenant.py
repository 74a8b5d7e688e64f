"""Whose a request's grammar compile is: the router says, by the tenant its API key names; a tenant cannot.

    router    every request it forwards carries ``x-kvmesh-tenant: <tenant>`` (percent-encoded): the key's tenant
              (router/admission/tenants.py; a ``user`` sub-tenant's key's tenant, so ``user`` names change
              nothing); a client that sends the header itself gets a 400 naming it (router/http/router_only.py)
    replica   the compile turns (engine/grammar_pool.py) go by it. A caller without the internal key that sends it
              gets a 403, as a body's ``kv_transfer_params`` does (a replica with no internal key trusts its callers,
              as for the KV plane: replica/server/kv_plane.py). Without the header, the turns go by the request's
              ``user``: a replica serving clients directly knows no more of who sent it.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING
from urllib.parse import quote, unquote

from kvmesh.replica.openai.router_header import router_header
from kvmesh.replica.serving.errors import ProtocolError

if TYPE_CHECKING:
    from pydantic import BaseModel
    from starlette.requests import Request

TENANT_HEADER = "x-kvmesh-tenant"
"""The router's header naming the tenant a request's compiles are charged to."""
COMPILE_SECONDS_HEADER = "x-kvmesh-grammar-compile-s"
"""A replica's response header: the seconds its compile processes worked for the request (replica/server/
compile_seconds.py), which its router charges to the tenant's fair share (router/http/compile_charge.py)."""
MAX_TENANT_CHARS = 256
"""A longer header value is refused (a tenant's name is a metric label, far shorter)."""
_CHARGED = "_compile_tenant"
"""Where a request keeps the tenant its compiles are charged to (``charge_compiles``)."""


def tenant_header(tenant: str) -> dict[str, str]:
    """The header the router sends for ``tenant`` (percent-encoded: any name is one header-safe value)."""
    return {TENANT_HEADER: _encoded(tenant)}


@functools.lru_cache(maxsize=1024)
def _encoded(tenant: str) -> str:
    """``tenant`` percent-encoded (once per tenant: the router sends it on every request)."""
    return quote(tenant, safe="")


def compile_tenant(http: Request, internal_key: str | None) -> str | None:
    """The tenant the router named for this request (None: no header, the turns go by ``user``); a 403 when a
    caller other than the cluster sends it to a replica that has an internal key."""
    value = router_header(http, TENANT_HEADER, internal_key, "names the tenant the router's key check found")
    if value is None:
        return None
    if not value or len(value) > MAX_TENANT_CHARS:
        raise ProtocolError(f"header {TENANT_HEADER} must name a tenant in 1 to {MAX_TENANT_CHARS} characters",
                            param=TENANT_HEADER)
    return unquote(value)


def charge_compiles(request: BaseModel, tenant: str | None) -> None:
    """Charge ``request``'s grammar compiles to ``tenant``, the one its router named (None: to its ``user``). Kept
    beside the request's fields, not among them (no client sends it), nor as a pydantic private attribute (one costs
    every validation of every request ~1 us); pydantic's dumps leave it out."""
    request.__dict__[_CHARGED] = tenant


def charged_tenant(request: BaseModel, user: str | None) -> str | None:
    """Whom ``request``'s grammar compiles are charged to: the tenant its router named, else its ``user``."""
    return request.__dict__.get(_CHARGED) or user
