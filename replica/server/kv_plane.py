"""The KV plane is the cluster's own: who may ask this replica to move KV.

    /kv/*                                  the auth middleware (replica/openai/auth.py, ``is_kv_plane``):
                                           the internal key only
    a body with ``kv_transfer_params``     ``check_transfer_params``, on the decoded request, before
                                           kv_request.py acts on it: 403 unless the caller presented the
                                           internal key (``scope["state"]["kvmesh_internal"]``)

Why: the field names a URL this replica calls carrying the cluster's key, and a lease or a pull moves
blocks across tenants' salts. A tenant reaching it could read another tenant's salted cache, plant KV under
a popular prompt, or make the replica call out with the key. A replica with no internal key configured
(only on a loopback bind when transfer is on: cluster/config/trees.py) trusts its API key, as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvmesh.replica.openai.auth import INTERNAL_SCOPE_KEY, KV_PLANE_REFUSED
from kvmesh.replica.serving.errors import ProtocolError

if TYPE_CHECKING:
    from fastapi import Request
    from kvmesh.replica.openai.sampling_fields import SamplingFields
    from kvmesh.replica.server.config import ReplicaServerConfig

KV_PATH_PREFIX = "/kv/"
"""Every path under it is the KV plane (handshake, lease, release, peers)."""
TRANSFER_FIELD = "kv_transfer_params"


def is_kv_plane(path: str) -> bool:
    """Whether ``path`` is one of the KV plane's (the auth middleware's rule)."""
    return path.startswith(KV_PATH_PREFIX)


def check_transfer_params(server: ReplicaServerConfig, http: Request, req: SamplingFields) -> None:
    """A 403 for a decoded body with a non-null ``kv_transfer_params`` from a caller without the internal key
    (when this replica has one)."""
    if server.internal_key is None or req.kv_transfer_params is None:
        return
    if not http.scope.get("state", {}).get(INTERNAL_SCOPE_KEY, False):  # set by the auth middleware
        raise ProtocolError(f"{TRANSFER_FIELD}: {KV_PLANE_REFUSED}; the router sets it (prefill/decode split, "
                            "peer pulls), so remove it from the request", 403, param=TRANSFER_FIELD)
