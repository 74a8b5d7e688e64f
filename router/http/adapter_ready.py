"""A LoRA adapter's request routed to a replica that lacks the adapter: the router loads it there first.

The load itself is the control room's (router/control/adapter_loads.py, reached through the running router's
``ensure_adapter``); here is what the proxy does when it fails: the replica counts as tried, the request goes
to the next replica of its pool, and when none is left the client gets a 502 naming every failed load.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from kvmesh.replica.serving.errors import ProtocolError, echo
from kvmesh.router.routing.model_pools import AdapterLoadError

if TYPE_CHECKING:
    from kvmesh.router.config import RouterConfig
    from kvmesh.router.http.proxy_request import ProxyRequest
    from kvmesh.router.routing.model_pools import ModelPool


class AdapterLoader(Protocol):
    """What this needs of the running router (``RouterRuntime``)."""

    config: RouterConfig

    async def ensure_adapter(self, replica_id: str, pool: ModelPool | None) -> None: ...


async def adapter_ready(runtime: AdapterLoader, rid: str, request: ProxyRequest, tried: list[str]) -> bool:
    """Whether ``rid`` has (or just loaded) ``request``'s adapter; False (``rid`` tried) when its load failed and
    another replica of the pool is left. None left: ProtocolError 502 naming the failed loads."""
    pool = request.model_pool
    try:
        await runtime.ensure_adapter(rid, pool)
        return True
    except AdapterLoadError as e:
        tried.append(rid)
        request.failed_over.append(f"{rid}: {e}")
        if len(tried) >= runtime.config.upstream.max_attempts or not pool.replicas - set(tried):
            raise ProtocolError(f"adapter `{echo(pool.lora_name)}` could not be loaded on a replica: "
                                + "; ".join(request.failed_over), 502) from None
        return False
