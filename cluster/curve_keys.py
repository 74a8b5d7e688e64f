"""The CURVE keypairs that make a serve cluster's KV event streams private (``replicas.private_events``).

The replicas' event sockets get the server keypair and admit only the router's public key; the router
gets its own keypair and the server's public key (events/curve.py does the ZeroMQ part).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CurveKeys:
    """The config fields that make a cluster's event streams private (events/curve.py)."""

    replicas: dict[str, Any]
    router: dict[str, Any]


def generate_curve_keys() -> CurveKeys:
    from kvmesh.events.curve import generate_keypair

    server_public, server_secret = generate_keypair()
    router_public, router_secret = generate_keypair()
    return CurveKeys(
        replicas={"kv_events_curve_secret_key": server_secret, "kv_events_curve_client_keys": (router_public,)},
        router={"events_curve_server_key": server_public, "events_curve_public_key": router_public,
                "events_curve_secret_key": router_secret})
