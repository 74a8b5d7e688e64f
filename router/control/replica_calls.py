"""The router's HTTP to its replicas: its two keep-alive clients and the credentials every call carries.

``requests`` carries the proxied requests and what goes with them (probe requests, KV handoffs, pull-peer
registrations); ``control`` the probes and the control calls (``/v1/models``, adapter loads, ``/metrics``,
prefix-cache resets), each within its own deadline (``UpstreamPool.fetch``: the connect timeout, an adapter load
``upstream.adapter_load_timeout_s``). Both are made by ``start`` in the router's event loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvmesh.router.http.upstream import UpstreamPool

if TYPE_CHECKING:
    from kvmesh.router.config import RouterConfig


class ReplicaCalls:
    """See the module doc."""

    def __init__(self, config: RouterConfig) -> None:
        self._config = config
        self.upstream = config.upstream
        """Timeouts of the calls (``RouterConfig.upstream``)."""
        self.requests: UpstreamPool | None = None
        """Proxied requests and what goes with them (None until started)."""
        self.control: UpstreamPool | None = None
        """Probes and control calls (None until started)."""

    def headers(self) -> dict[str, str]:
        """Credentials of every call to a replica: the cluster's internal key, else ``upstream.replica_api_key``."""
        key = self._config.internal_key or self._config.upstream.replica_api_key
        return {"Authorization": f"Bearer {key}"} if key else {}

    def start(self) -> None:
        cfg = self.upstream
        # no read timeout of the pool's own: every control call is a fetch with its deadline, which would otherwise
        # be cut to the connect timeout (an adapter load of several seconds failed as "sent nothing")
        self.control = UpstreamPool(cfg.connect_timeout_s, None)
        self.requests = UpstreamPool(cfg.connect_timeout_s, cfg.request_timeout_s)

    def close(self) -> None:
        for pool in (self.control, self.requests):
            if pool is not None:
                pool.close()
