"""A header only the cluster's router may send a replica (the tenant it found, its booking on the replica's load):
honoured from the internal key, a 403 from anyone else when the replica has one."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvmesh.replica.openai.auth import INTERNAL_SCOPE_KEY
from kvmesh.replica.serving.errors import ProtocolError

if TYPE_CHECKING:
    from fastapi import Request


def router_header(http: Request, name: str, internal_key: str | None, what: str) -> str | None:
    """Header ``name``'s value (None: not sent); a 403 saying it ``what`` when a caller other than the cluster sends
    it to a replica that has an internal key."""
    value = http.headers.get(name)
    if value is not None and internal_key is not None and not http.scope.get("state", {}).get(INTERNAL_SCOPE_KEY,
                                                                                              False):
        raise ProtocolError(f"header {name} may be sent only by the router (the cluster's internal key): it {what}; "
                            "remove it from the request", 403, param=name)
    return value
