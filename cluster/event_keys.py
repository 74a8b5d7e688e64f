"""The CURVE keys that make a ``kvmesh serve`` cluster's KV event streams private (events/curve.py).

One keypair for the replicas' sockets and one for the router that subscribes to them; the replicas
admit only the router's public key. Generated per run by the launcher, never written anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class CurveKeys:
    """The config fields that make a cluster's event streams private (events/curve.py)."""

    replicas: dict[str, Any] = field(repr=False)
    """The replicas' EngineConfig fields (their secret key, the router's public key). SECRET."""
    router: dict[str, Any] = field(repr=False)
    """The router's RouterConfig fields (the replicas' public key, its own keypair). SECRET."""


def curve_keys() -> CurveKeys:
    from kvmesh.events.curve import generate_keypair

    server_public, server_secret = generate_keypair()
    router_public, router_secret = generate_keypair()
    return CurveKeys(
        replicas={"kv_events_curve_secret_key": server_secret, "kv_events_curve_client_keys": (router_public,)},
        router={"events_curve_server_key": server_public, "events_curve_public_key": router_public,
                "events_curve_secret_key": router_secret})
