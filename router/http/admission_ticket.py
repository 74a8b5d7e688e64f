"""What the admission gate (admission_gate.py) keeps with a request: its ``Waiting`` while it is in the queue, its
``Ticket`` once it is let go. A request let go at once, with nothing else waiting, never needs a future."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from kvmesh.router.admission.queue import Waiter
    from kvmesh.router.http.proxy_request import ProxyRequest
    from kvmesh.router.routing.kv_router import RouteDecision


@dataclass(slots=True, eq=False)
class Ticket:
    """An admitted request: its place in the books and the route that let it go."""

    waiter: Waiter
    decision: RouteDecision | None
    """The route that let it go (None: no replica; dispatch answers 503)."""
    start: float
    """``time.perf_counter()`` at arrival."""


@dataclass(slots=True, eq=False)
class Waiting:
    """What a waiter carries here (``Waiter.payload``)."""

    request: ProxyRequest
    start: float
    future: asyncio.Future | None = None
    """Resolved with the route that lets it go, or a ``Shed`` (made once it may wait: ``future_of``)."""
    timer: asyncio.TimerHandle | None = None
    """Sheds it when its deadline passes while it waits."""
    granted: bool = False
    """Let go, its task not yet run to its dispatch (``AdmissionGate.granted``)."""
    priced: bool = False
    """The gate said WAIT when it arrived (``AdmissionGate._at_once``): its first pump is not needed."""
    at_once: bool = False
    """It arrived to an empty queue with no one let go on their way: tried before it is queued (``_at_once``)."""


def waiting_of(waiter: Waiter) -> Waiting:
    """What the gate put in ``waiter`` (``AdmissionGate._arrive``: every waiter it queues carries one)."""
    return cast(Waiting, waiter.payload)


def future_of(waiter: Waiter) -> asyncio.Future:
    """The future ``waiter``'s request awaits (made here when first asked for: one let go at once has none)."""
    waiting = waiting_of(waiter)
    if waiting.future is None:
        waiting.future = asyncio.get_running_loop().create_future()
    return waiting.future
