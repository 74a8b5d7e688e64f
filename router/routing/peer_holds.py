"""Other routers' held predictions in this router's index (``RouterConfig.predict_hold_s`` with several routers).

A router that holds its predictions (router/routing/predictions.py ``predict_held``) tells the others each request's
blocks with a hold number, and the number again, without blocks, when the replica sends the first bytes or the request
leaves it (router/control/router_sync.py). Each other router holds those blocks on that replica the same way, under
its own ``predict_hold_s`` as the backstop, and releases them when the number comes back: a long prompt another router
sent is not forgotten here half-way through its prefill either.

What a peer says is bounded: at most ``MAX_PEER_HOLDS`` held at once (past it the oldest is released, so it lasts
``predict_ttl_s`` more), and one never released lasts the backstop. A router whose ``predict_hold_s`` is 0 holds
nothing for others: their blocks last ``predict_ttl_s``, as plain predictions do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvmesh.router.replicas.replica import Replica
    from kvmesh.router.routing.kv_router import KVRouter

MAX_PEER_HOLDS = 1 << 16
"""Other routers' held predictions kept at once (the requests all routers send within a backstop, with room)."""


class PeerHolds:
    """The tickets of other routers' held predictions in ``router``'s index, by (router id, hold number)."""

    def __init__(self, router: KVRouter, max_holds: int = MAX_PEER_HOLDS) -> None:
        self.router = router
        self.max_holds = max_holds
        self._tickets: dict[tuple[str, int | str], int] = {}
        """(router id, its hold number) -> this index's ticket, oldest first."""

    def __len__(self) -> int:
        return len(self._tickets)

    def hold(self, router_id: str, number: int | str, replica: Replica, keys: Sequence[int], now: float) -> None:
        """Router ``router_id`` sent a request with ``keys`` to ``replica`` and holds its prediction as ``number``
        (its hold on the stream; the simulator's request id): hold it here too until ``release`` (a plain prediction
        where this router holds none). Under the router's lock."""
        router = self.router
        hold_s = router.predict_hold_s
        if hold_s <= 0:
            router.index.predict(replica.id, keys, now=now)
            return
        ticket = router.index.predict_held(replica.id, keys, now, 0, hold_s)
        if ticket is None:  # every block already held or predicted there
            return
        tickets = self._tickets
        tickets[(router_id, number)] = ticket
        if len(tickets) > self.max_holds:
            oldest = next(iter(tickets))
            router.index.predictions.release(tickets.pop(oldest), now)

    def release(self, router_id: str, number: int | str, now: float) -> None:
        """Router ``router_id``'s request ``number`` was answered or left its replica: its blocks last
        ``predict_ttl_s`` more (nothing where none is held: unknown, released already, or past its backstop). Under
        the router's lock."""
        ticket = self._tickets.pop((router_id, number), None)
        if ticket is not None:
            self.router.index.predictions.release(ticket, now)
