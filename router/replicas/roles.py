"""Replica roles: who may decode a request, who may prefill one for another replica.

    prefill  computes prompts for other replicas (the router's P/D split); never decodes a client's request
    decode   decodes; long uncached prompts may be prefilled elsewhere first
    both     either (the default: a replica of a cluster without prefill replicas)
"""

from __future__ import annotations

from kvmesh.router.replicas.wire_enum import WireEnum


class ReplicaRole(WireEnum):
    """A replica's role (the module doc); its value is its name on the wire and in configuration."""

    PREFILL = "prefill"
    DECODE = "decode"
    BOTH = "both"


PREFILL, DECODE, BOTH = ReplicaRole.PREFILL, ReplicaRole.DECODE, ReplicaRole.BOTH
ROLES = tuple(ReplicaRole)
"""Every value a replica's role takes."""


def check_role(role: object, field: str = "role") -> ReplicaRole:
    """``role`` (a role or its name) as a ``ReplicaRole``; else a ValueError naming ``field`` and the choices."""
    if not isinstance(role, str) or role not in ROLES:
        raise ValueError(f"{field}={role!r} is not a replica role; choose one of {', '.join(ROLES)}")
    return ReplicaRole(role)
