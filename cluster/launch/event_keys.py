"""The CURVE keys that make a ``kvmesh serve`` cluster's KV event streams private (events/curve.py).

One keypair for the replicas' sockets and one for the router that subscribes to them; the replicas
admit only the router's public key. Generated per run by the launcher, never written anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from kvmesh.events.config import PublisherConfig
from kvmesh.router.config import RouterConfig


@dataclass(frozen=True)
class CurveKeys:
    """The two keypairs of a cluster's private event streams (Z85). SECRET."""

    server_public: str
    """The replicas' public key: the router checks it is talking to them."""
    server_secret: str = field(repr=False)
    """The replicas' secret key (their event sockets are CURVE servers). SECRET."""
    router_public: str
    """The router's public key: the only subscriber the replicas admit."""
    router_secret: str = field(repr=False)
    """The router's secret key. SECRET."""

    def publisher(self, events: PublisherConfig) -> PublisherConfig:
        """The replicas' events section with their secret key and the router as the one admitted client."""
        return replace(events, curve_secret_key=self.server_secret, curve_client_keys=(self.router_public,))

    def router(self, router: RouterConfig) -> RouterConfig:
        """The router's section with the replicas' public key and its own keypair."""
        events = replace(router.events, curve_server_key=self.server_public, curve_public_key=self.router_public,
                         curve_secret_key=self.router_secret)
        return replace(router, events=events)


def curve_keys() -> CurveKeys:
    from kvmesh.events.curve import generate_keypair

    server_public, server_secret = generate_keypair()
    router_public, router_secret = generate_keypair()
    return CurveKeys(server_public, server_secret, router_public, router_secret)
