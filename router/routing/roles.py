"""Replica roles: who may decode a request, who may prefill one for another replica.

    prefill  computes prompts for other replicas (the router's P/D split); never decodes a client's request
    decode   decodes; long uncached prompts may be prefilled elsewhere first
    both     either (the default: a replica of a cluster without prefill replicas)
"""

from __future__ import annotations

PREFILL, DECODE, BOTH = "prefill", "decode", "both"
ROLES = (PREFILL, DECODE, BOTH)
"""Every value a replica's role takes."""


def check_role(role: object, field: str = "role") -> str:
    """``role`` if it is one of ``ROLES``; else a ValueError naming ``field`` and the choices."""
    if role not in ROLES:
        raise ValueError(f"{field}={role!r} is not a replica role; choose one of {', '.join(ROLES)}")
    return role  # type: ignore[return-value]
