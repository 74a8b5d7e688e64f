"""Replica roles in a ``kvmesh serve`` cluster: who prefills, who decodes, and their names.

    --num-prefill-replicas 0:   replica-0 … replica-{n-1}               role both (each serves requests whole)
    --num-prefill-replicas N:   replica-0 … replica-{n-1}               role decode (the router's decode targets)
                                prefill-n … prefill-{n+N-1}             role prefill (compute prompts, lease the KV)

One index space for every role: a replica's index gives its ports (http_port + i, event_port + 2i) and its
placement group, and an index is never reused (cluster/fleet/operations.py), so names stay unique across roles.
The role is in the name (``prefill-3``) and on the replica's handle; the router is told it at registration
(``RouterClient.register``).
"""

from __future__ import annotations

from kvmesh.router.replicas.roles import BOTH, DECODE, PREFILL

Role = str
"""One of the router's ``ROLES`` (router/replicas/roles.py: the words, and ``check_role``)."""


def serving_role(num_prefill_replicas: int) -> Role:
    """The role of the ``--num-replicas`` replicas: decode next to prefill replicas, else both."""
    return DECODE if num_prefill_replicas > 0 else BOTH


def replica_name(index: int, role: Role) -> str:
    """``prefill-3`` for a prefill replica, ``replica-3`` for the others."""
    return f"{'prefill' if role == PREFILL else 'replica'}-{index}"


def decodes(role: Role) -> bool:
    """The replica serves requests to their end (the router's decode targets): role decode or both."""
    return role != PREFILL


def kv_transfer_on(mode: str, num_prefill_replicas: int) -> bool:
    """Whether serve's replicas get their KV transfer (``replicas.kv_transfer``): on, off, or auto = on when there
    are prefill replicas (they need it). Peer pulls alone take ``on``: each replica's NIXL agent runs a progress
    thread that busy-polls about one CPU core, idle or not, which a cluster should choose, not get by default."""
    if mode == "auto":
        return num_prefill_replicas > 0
    return mode == "on"
