"""The bounded queue of one model: priority first (lower first, as vLLM), then fair share, then arrival.

    bands:  priority -> tenant -> [waiters, oldest first]

``head`` is the waiter to serve next: the best (lowest) priority band; in it, the tenant whose usage
(fair_share.py, read through the caller's ``usage``) is least, ties to the oldest; that tenant's oldest
waiter. Usage is read when the head is asked for, so a tenant's share is judged on what it used until
then, not when its requests arrived. A waiter leaves by ``remove`` (served, shed, its client gone) in
O(its tenant's waiters).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from kvmesh.router.admission.rate_limit import TokenRate


@dataclass(slots=True, eq=False)
class Waiter:
    """One request waiting in the router (``Admission.arrive`` makes it)."""

    model: str
    """The queue it waits in (the request's ``model``, a plain string: one queue per model)."""
    tenant: str
    """Whose share and limits it counts against (tenants.py)."""
    priority: int
    """Lower is served first (vLLM's ``priority``)."""
    arrival: float
    """When it arrived (the caller's clock)."""
    deadline: float | None
    """When its first token must come by, on the same clock (None: no deadline)."""
    prompt_tokens: int
    """Prompt tokens it brings (the rate limit took them at arrival)."""
    limit: TokenRate | None = None
    """Its tenant's token-rate limit (its output is taken from the bucket when it ends)."""
    bucket: str | None = None
    """The tenant whose bucket ``limit`` is (a ``user`` sub-tenant's key's: tenants.py); None: ``tenant``'s."""
    seq: int = 0
    """Arrival order within the router process (ties)."""
    payload: object = field(default=None, repr=False)
    """What the caller keeps with it (the HTTP router: the event it waits on)."""


class AdmissionQueue:
    """Waiters of one model, ordered for ``head`` (see the module doc)."""

    def __init__(self) -> None:
        self.bands: dict[int, dict[str, deque[Waiter]]] = {}
        self._len = 0
        self._seq = 0

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Waiter]:
        for band in self.bands.values():
            for waiters in band.values():
                yield from waiters

    def push(self, waiter: Waiter) -> None:
        self._seq += 1
        waiter.seq = self._seq
        self.bands.setdefault(waiter.priority, {}).setdefault(waiter.tenant, deque()).append(waiter)
        self._len += 1

    def remove(self, waiter: Waiter) -> bool:
        """Take ``waiter`` out (False when it was not in)."""
        band = self.bands.get(waiter.priority)
        waiters = band.get(waiter.tenant) if band is not None else None
        if band is None or not waiters:
            return False
        try:
            waiters.remove(waiter)
        except ValueError:
            return False
        self._len -= 1
        if not waiters:
            del band[waiter.tenant]
            if not band:
                del self.bands[waiter.priority]
        return True

    @property
    def best_priority(self) -> int | None:
        """The lowest priority waiting (None: empty)."""
        return min(self.bands) if self.bands else None

    def head(self, usage: Callable[[str], float]) -> Waiter | None:
        """The waiter to serve next (None: empty); ``usage(tenant)``: its fair-share usage now."""
        if not self.bands:
            return None
        band = self.bands[min(self.bands)]
        tenant = min(band, key=lambda name: (usage(name), band[name][0].seq))
        return band[tenant][0]

    def in_order(self, usage: Callable[[str], float], limit: int) -> list[Waiter]:
        """Up to ``limit`` waiters in about the order ``head`` serves them: the best band first; in a band the tenants
        taken in turn by their usage now (each one's oldest first), as fair share would serve them while none of
        them goes. The first is ``head``'s."""
        out: list[Waiter] = []
        for priority in sorted(self.bands):
            band = self.bands[priority]
            tenants = sorted(band, key=lambda name: (usage(name), band[name][0].seq))
            depth = 0
            while len(out) < limit and any(depth < len(band[name]) for name in tenants):
                out.extend(band[name][depth] for name in tenants if depth < len(band[name]))
                depth += 1
            if len(out) >= limit:
                return out[:limit]
        return out

    def newest_of(self, tenant: str) -> Waiter | None:
        """``tenant``'s waiter to give up its place (queue_share.py): the newest of its least urgent (None: none)."""
        held = [p for p, band in self.bands.items() if tenant in band]
        return self.bands[max(held)][tenant][-1] if held else None

    def ahead_of(self, priority: int, tenant: str, usage: Callable[[str], float]) -> int:
        """About how many waiters go on before a new arrival of ``tenant`` at ``priority``: every waiter of a better
        band; in its own band its tenant's own waiters, and of each tenant that has used no more than it
        (``usage``) as many as fair share serves before it (each at most its own waiters + 1, served in turn); a
        tenant that has used more goes after it. The flood's queue is not a light tenant's wait."""
        ahead = 0
        for p, band in self.bands.items():
            if p < priority:
                ahead += sum(len(waiters) for waiters in band.values())
            elif p == priority:
                own = len(band.get(tenant, ()))
                mine = usage(tenant)
                ahead += own + sum(min(len(waiters), own + 1) for name, waiters in band.items()
                                   if name != tenant and usage(name) <= mine)
        return ahead
