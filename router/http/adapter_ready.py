"""A LoRA adapter's request routed to a replica that lacks the adapter: the router loads it there first.

The load itself is the control room's (router/control/adapter_loads.py, reached through the running router's
``ensure_adapter``); here is what the proxy does when it fails: the replica counts as tried, the request goes
to the next replica of its pool, and when none is left the client gets a 502 naming every failed load.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvmesh.replica.serving.errors import ProtocolError, echo
from kvmesh.router.routing.model_pools import AdapterLoadError

if TYPE_CHECKING:
    from kvmesh.router.http.data_plane import DataPlane
    from kvmesh.router.http.proxy_request import ProxyRequest
    from kvmesh.router.replicas.replica import Replica


async def adapter_ready(plane: DataPlane, replica: Replica, request: ProxyRequest, tried: list[str]) -> bool:
    """Whether ``replica`` has (or just loaded) ``request``'s adapter; False (``replica`` tried) when its load failed
    and another replica of the pool is left. None left: ProtocolError 502 naming the failed loads."""
    pool = request.model_pool
    try:
        await plane.ensure_adapter(replica, pool)
        return True
    except AdapterLoadError as e:
        tried.append(replica.id)
        request.failed_over.append(f"{replica.id}: {e}")
        if len(tried) >= plane.config.upstream.max_attempts or not pool.replicas - set(tried):
            raise ProtocolError(f"adapter `{echo(pool.lora_name)}` could not be loaded on a replica: "
                                + "; ".join(request.failed_over), 502) from None
        return False
