"""Requests admission holds in the router for a replica, counted in that replica's load.

A request that must wait for the replica its route chose is not in that replica's load yet (it counts from its
dispatch), so every request routed meanwhile saw the holder of a shared prefix as free as before the queue formed,
chose it too and queued behind it unseen: the router's queue grew in front of one or two replicas while the rest of the
fleet idled. Each pass of the admission pump (router/http/admission_gate.py) prices the queue's first waiters in
serving order; each that must wait puts its uncached prompt tokens and itself on its replica's
``held_prefill_tokens`` / ``held_requests`` (router/replicas/load.py: in ``prefill_backlog`` and ``decode_load``), so
the waiters after it, and any request routed before the next pass, price the queue that replica really has and go
elsewhere once recomputing their prompt there is cheaper. A pass takes the previous pass's holds off first.

Holds are this router process's own (other processes of the host and other routers do not see them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvmesh.router.replicas.replica import Replica


class HeldLoad:
    """The holds of the current pass, per model (one queue per model)."""

    def __init__(self) -> None:
        self._by_model: dict[str, dict[str, tuple[Replica, int, int]]] = {}
        """model -> replica id -> (its record, tokens held, requests held)."""

    def release(self, model: str) -> None:
        """Take ``model``'s holds off their replicas' loads (a new pass sets them afresh)."""
        for replica, tokens, requests in self._by_model.pop(model, {}).values():
            load = replica.load
            load.held_prefill_tokens = max(0, load.held_prefill_tokens - tokens)
            load.held_requests = max(0, load.held_requests - requests)

    def hold(self, model: str, replica: Replica, uncached_tokens: int) -> None:
        """One waiter of ``model`` waits for ``replica`` with ``uncached_tokens`` to compute there."""
        held = self._by_model.setdefault(model, {})
        _, tokens, requests = held.get(replica.id, (replica, 0, 0))
        held[replica.id] = (replica, tokens + uncached_tokens, requests + 1)
        load = replica.load
        load.held_prefill_tokens += uncached_tokens
        load.held_requests += 1
