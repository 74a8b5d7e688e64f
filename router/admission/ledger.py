"""Where admission keeps what must be the same for every router process: per-tenant usage and buckets,
and how many requests wait per model.

``TenantLedger`` is the protocol; ``LocalLedger`` keeps it in this process (one router process, the
simulator, tests); ``SharedLedger`` (shared_ledger.py) keeps it in shared memory for ``router.workers`` > 1.
Every method takes the time: the core reads no clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from kvmesh.router.admission.fair_share import decayed
from kvmesh.router.admission.rate_limit import TokenRate, refilled, wait_for

NO_PRIORITY = 1 << 62
"""``best_waiting`` when nothing waits (a priority no request has)."""


class TenantLedger(Protocol):
    """Per-tenant usage (fair share) and token buckets (rate limits), per-model queue lengths."""

    def usage(self, tenant: str, now: float) -> float:
        """The tenant's decayed weighted tokens (fair_share.py) at ``now``."""
        ...

    def charge(self, tenant: str, weighted: float, tokens: int, limit: TokenRate | None, now: float) -> None:
        """Add ``weighted`` to the tenant's usage and take ``tokens`` from its bucket (it may go below zero)."""
        ...

    def try_take(self, tenant: str, tokens: int, limit: TokenRate, now: float) -> float:
        """Take ``tokens`` from the tenant's bucket if it holds them: 0.0; else the seconds until it will."""
        ...

    def publish_queue(self, model: str, queued: int, best_priority: int) -> None:
        """This process's queue of ``model``: its length and best (lowest) waiting priority."""
        ...

    def queued(self, model: str) -> int:
        """Requests waiting for ``model`` in every router process."""
        ...

    def better_elsewhere(self, model: str, priority: int) -> bool:
        """Whether another router process holds a request for ``model`` of a better (lower) priority."""
        ...

    def waiting_changed(self, model: str, tenant: str, delta: int, pay: bool = True) -> None:
        """``tenant`` has ``delta`` more requests waiting for ``model`` in this process; a request leaving
        (``delta`` < 0) with ``pay`` pays one place its tenant owes (``owe``), if it owes any."""
        ...

    def waiting_by_tenant(self, model: str) -> dict[str, int]:
        """Each tenant's requests waiting for ``model`` in every router process (tenants with none left out)."""
        ...

    def counted_as(self, tenant: str) -> str:
        """The name ``tenant``'s waiting requests are counted under in ``waiting_by_tenant`` (itself, unless the
        ledger folds tenants past its table into one)."""
        ...

    def owe(self, model: str, tenant: str) -> None:
        """An arrival in this process took a place of ``tenant``'s whose waiters are all in other processes: it
        owes one (the process holding its newest waiter displaces it, or its next request to leave pays it)."""
        ...

    def debts(self, model: str) -> dict[str, int]:
        """The places tenants owe in ``model``'s queue (empty: none)."""
        ...

    def pay_debt(self, model: str, tenant: str) -> bool:
        """Take one of the places ``tenant`` owes, to displace a waiter of its here (False: none is owed now)."""
        ...


@dataclass(slots=True)
class TenantState:
    """One tenant's numbers: usage as of ``usage_at``, bucket level as of ``level_at`` (None: full)."""

    usage: float = 0.0
    usage_at: float = 0.0
    level: float | None = None
    level_at: float = 0.0


class LocalLedger:
    """``TenantLedger`` for one process. Keeps at most ``max_tenants`` tenants: past it, those with the
    least usage and a full bucket are forgotten (they are as good as new)."""

    def __init__(self, half_life_s: float, max_tenants: int = 4096) -> None:
        self.half_life_s = half_life_s
        self.max_tenants = max_tenants
        self.tenants: dict[str, TenantState] = {}
        self.queues: dict[str, tuple[int, int]] = {}
        self.waiting: dict[str, dict[str, int]] = {}
        """Model -> tenant -> its requests waiting."""
        self.owed: dict[str, dict[str, int]] = {}
        """Model -> tenant -> places it owes (one process: never any, every waiter is here to displace)."""

    def _state(self, tenant: str, now: float) -> TenantState:
        state = self.tenants.get(tenant)
        if state is None:
            if len(self.tenants) >= self.max_tenants:
                self._forget(now)
            state = self.tenants[tenant] = TenantState(usage_at=now, level_at=now)
        return state

    def _forget(self, now: float) -> None:
        """Drop the lightest half of the idle tenants (full bucket)."""
        idle = sorted((decayed(s.usage, s.usage_at, now, self.half_life_s), name)
                      for name, s in self.tenants.items() if s.level is None)
        for _, name in idle[:max(1, len(idle) // 2)]:
            del self.tenants[name]

    def usage(self, tenant: str, now: float) -> float:
        state = self.tenants.get(tenant)
        return 0.0 if state is None else decayed(state.usage, state.usage_at, now, self.half_life_s)

    def charge(self, tenant: str, weighted: float, tokens: int, limit: TokenRate | None, now: float) -> None:
        state = self._state(tenant, now)
        state.usage = decayed(state.usage, state.usage_at, now, self.half_life_s) + weighted
        state.usage_at = now
        if limit is not None and tokens:
            level = limit.burst_tokens if state.level is None else refilled(state.level, state.level_at, now, limit)
            state.level, state.level_at = level - tokens, now

    def try_take(self, tenant: str, tokens: int, limit: TokenRate, now: float) -> float:
        state = self._state(tenant, now)
        level = limit.burst_tokens if state.level is None else refilled(state.level, state.level_at, now, limit)
        wait = wait_for(level, tokens, limit)
        if wait == 0.0:
            level -= tokens
        state.level, state.level_at = level, now
        if state.level >= limit.burst_tokens:
            state.level = None  # full again: forgettable
        return wait

    def publish_queue(self, model: str, queued: int, best_priority: int) -> None:
        self.queues[model] = (queued, best_priority)

    def queued(self, model: str) -> int:
        return self.queues.get(model, (0, NO_PRIORITY))[0]

    def better_elsewhere(self, model: str, priority: int) -> bool:
        return False  # one process: there is no elsewhere

    def waiting_changed(self, model: str, tenant: str, delta: int, pay: bool = True) -> None:
        waiting = self.waiting.setdefault(model, {})
        n = waiting.get(tenant, 0) + delta
        if n > 0:
            waiting[tenant] = n
        else:
            waiting.pop(tenant, None)
        if delta < 0 and pay:
            self.pay_debt(model, tenant)

    def waiting_by_tenant(self, model: str) -> dict[str, int]:
        return dict(self.waiting.get(model, {}))

    def counted_as(self, tenant: str) -> str:
        return tenant

    def owe(self, model: str, tenant: str) -> None:
        owed = self.owed.setdefault(model, {})
        owed[tenant] = owed.get(tenant, 0) + 1

    def debts(self, model: str) -> dict[str, int]:
        return dict(self.owed.get(model, {}))

    def pay_debt(self, model: str, tenant: str) -> bool:
        owed = self.owed.get(model, {})
        if not owed.get(tenant):
            return False
        owed[tenant] -= 1
        if not owed[tenant]:
            del owed[tenant]
        return True
