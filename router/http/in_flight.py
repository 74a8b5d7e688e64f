"""A dispatched request's place in its replica's load (router/routing/load.py), counted in one place: one slot per
sequence it runs there (``RouteDecision.sequences``: a chat's n, a completion's prompts x the larger of n and best_of).

    with InFlight(router, decision, prompt_tokens) as flight:  # on_dispatch
        opened = ...                                            # the attempt
        flight.answered()                                       # on_first_output; the answer finishes it
    # left without ``answered`` (a failure, a retry elsewhere) or by an exception (a cancellation too): on_finish,
    # and its peer pull, which will not land now, no longer counted on the replica (``KVRouter.forget_pull``)

A block left normally once ``answered`` hands the request to its answer (``Forwarder._answer``, relay.py), which
finishes it when its body ends; any other way out finishes it here, so no path leaves a replica counting a request
that is gone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvmesh.replica.openai.router_booking import booking_header

if TYPE_CHECKING:
    from kvmesh.router.replicas.replica import Replica
    from kvmesh.router.routing.kv_router import KVRouter
    from kvmesh.router.routing.load import LoadTracker
    from kvmesh.router.routing.route_decision import RouteDecision


class InFlight:
    """One attempt of a request on ``decision``'s replica, from its dispatch until its answer takes it over."""

    def __init__(self, router: KVRouter, decision: RouteDecision, prompt_tokens: int) -> None:
        self.router = router
        self.loads = router.loads
        self.decision = decision
        """Its replica and ``uncached_tokens``, read at each count as the answer's finish reads them."""
        self.prompt_tokens = prompt_tokens
        self.had_output = False
        """``on_first_output`` ran: the replica answered."""
        self.booking: int | None = None
        """Its booking number on a replica that publishes its load (router/replicas/bookings.py); None: none."""
        self.hold = 0
        """The number its held prediction goes by on the other routers (``predict_hold_s`` with sync; 0: none)."""

    def __enter__(self) -> InFlight:
        d = self.decision
        self.booking = self.loads.on_dispatch(d.replica, d.uncached_tokens, prompt_tokens=self.prompt_tokens,
                                              sequences=d.sequences)
        tell = self.router.choices_out
        if tell is not None:  # the other routers count it too (router/control/router_sync.py)
            self.hold = tell(d.replica, self.booking or 0, d.uncached_tokens, d.keys, self.router.predict_hold_s > 0)
        return self

    def headers(self) -> dict[str, str]:
        """The booking's header to the replica (none when it does not publish its load)."""
        if self.booking is None:
            return {}
        return booking_header(self.loads.router_id, self.booking, self.decision.uncached_tokens)

    def answered(self) -> None:
        """The replica answered (its first bytes, or the last attempt's error passed through): its prefill is done,
        and the answer finishes the request when its body ends."""
        d = self.decision
        self.loads.on_first_output(d.replica, d.uncached_tokens)
        self.had_output = True
        self._release()  # its prompt is computed: its blocks are the replica's to confirm

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is not None or not self.had_output:  # else its answer finishes it
            d = self.decision
            self.loads.on_finish(d.replica, d.uncached_tokens, had_output=self.had_output, sequences=d.sequences)
            if not self.had_output:
                self.router.forget_pull(d)
                self._release()

    def _release(self) -> None:
        """Its held prediction lasts ``predict_ttl_s`` more, here and on the other routers."""
        self.router.release_prediction(self.decision)
        if self.hold and (tell := self.router.holds_out) is not None:
            tell(self.decision.replica, self.hold)
            self.hold = 0


def reserved(loads: LoadTracker, replica: Replica) -> Reservation:
    """Count a request bound for ``replica`` before it is sent (a split's prefill call runs meanwhile), so
    admission sees the slot taken; released however the ``with`` block ends."""
    return Reservation(loads, replica)


class Reservation:
    """``reserved``'s context (a class: a ``contextlib.contextmanager`` costs more on every request)."""

    __slots__ = ("loads", "replica")

    def __init__(self, loads: LoadTracker, replica: Replica) -> None:
        self.loads, self.replica = loads, replica

    def __enter__(self) -> None:
        self.loads.reserve(self.replica, True)

    def __exit__(self, *exc: object) -> None:
        self.loads.reserve(self.replica, False)
