"""A tenant's token bucket held by every router of a fleet: each router keeps a copy of the one bucket.

Every router refills its copy at the tenant's whole rate and takes from it what *any* router served::

    this router    try_take / charge  ->  its copy (the inner ledger)  +  ``taken[tenant]`` (its running total)
    exchange       (router/control/quota_sync.py, every ``fleet_sync_s``) its totals go to the database, the
                   others' totals come back: each one's growth since last seen is charged to this copy (``absorb``)

So the copies agree up to one exchange's worth of traffic, and what the fleet serves over a span is the one
bucket's (its rate x the span + one burst) plus at most what the other routers let in during the last
exchange -- a debt every copy then waits out. The totals only grow: an exchange that is lost or repeated
changes nothing, and no clock is compared between routers (each refills by its own).

When the exchange fails for ``stale_s`` (the database slow or down), each copy refills at the rate divided by
the routers last seen alive (``degrade``): the fleet stays within the tenant's rate, and nobody is refused for
the database's sake. ``inner`` is a ``LocalLedger`` or a host's ``SharedLedger``: only the process that ``applies``
(worker 0 of a host) charges the others' totals into shared memory, once.
"""

from __future__ import annotations

import math

from kvmesh.router.admission.ledger import TenantLedger
from kvmesh.router.admission.rate_limit import TokenRate


class FleetLedger:
    """``TenantLedger`` (ledger.py) whose buckets count every router's tokens (module doc); the rest is ``inner``'s."""

    def __init__(self, inner: TenantLedger, applies: bool = True) -> None:
        self.inner = inner
        self.applies = applies
        """Charge the other routers' tokens to ``inner`` (False: a sibling process of this host does)."""
        self.taken: dict[str, int] = {}
        """Bucket -> tokens this process took from it since it started (only grows)."""
        self.limits: dict[str, TokenRate] = {}
        """Bucket -> its limit as last used here (what the others' tokens are charged with)."""
        self.seen: dict[tuple[str, str], int] = {}
        """(router, bucket) -> the total last read from the database."""
        self.share = 1.0
        """The part of each bucket's rate this copy refills at: 1 while exchanges succeed (``degrade``)."""

    # ---------------------------------------------------------------- fair share, queues: ``inner``'s, as before
    def usage(self, tenant: str, now: float) -> float:
        return self.inner.usage(tenant, now)

    def publish_queue(self, model: str, queued: int, best_priority: int) -> None:
        self.inner.publish_queue(model, queued, best_priority)

    def queued(self, model: str) -> int:
        return self.inner.queued(model)

    def better_elsewhere(self, model: str, priority: int) -> bool:
        return self.inner.better_elsewhere(model, priority)

    def waiting_changed(self, model: str, tenant: str, delta: int, pay: bool = True) -> None:
        self.inner.waiting_changed(model, tenant, delta, pay)

    def waiting_by_tenant(self, model: str) -> dict[str, int]:
        return self.inner.waiting_by_tenant(model)

    def counted_as(self, tenant: str) -> str:
        return self.inner.counted_as(tenant)

    def owe(self, model: str, tenant: str) -> None:
        self.inner.owe(model, tenant)

    def debts(self, model: str) -> dict[str, int]:
        return self.inner.debts(model)

    def pay_debt(self, model: str, tenant: str) -> bool:
        return self.inner.pay_debt(model, tenant)

    # ---------------------------------------------------------------- this router's tokens
    def _limit(self, bucket: str, limit: TokenRate) -> TokenRate:
        self.limits[bucket] = limit
        if self.share >= 1.0:
            return limit
        return TokenRate(limit.tokens_per_s * self.share, limit.burst_tokens)

    def try_take(self, tenant: str, tokens: int, limit: TokenRate, now: float) -> float:
        wait = self.inner.try_take(tenant, tokens, self._limit(tenant, limit), now)
        if wait == 0.0 and tokens > 0:
            self.taken[tenant] = self.taken.get(tenant, 0) + tokens
        return wait

    def charge(self, tenant: str, weighted: float, tokens: int, limit: TokenRate | None, now: float) -> None:
        if limit is None or not tokens:
            self.inner.charge(tenant, weighted, tokens, limit, now)
            return
        self.inner.charge(tenant, weighted, tokens, self._limit(tenant, limit), now)
        self.taken[tenant] = self.taken.get(tenant, 0) + tokens

    # ---------------------------------------------------------------- the other routers' tokens
    def absorb(self, totals: list[tuple[str, str, float]], now: float, first: bool = False) -> int:
        """The other routers' ``(router, bucket, total)`` as read: each total's growth since last read is charged to
        this copy of the bucket (a router read for the first time after this one's first exchange is charged its
        whole total; at ``first``, totals are only noted). A total that is not a finite number >= 0 is ignored,
        one that went down is noted as it is (that router started afresh). The tokens charged."""
        charged = 0
        for router, bucket, total in totals:
            if not (isinstance(total, (int, float)) and math.isfinite(total) and total >= 0):
                continue
            key, total = (router, bucket), int(total)
            before = self.seen.get(key, total if first else 0)
            self.seen[key] = total
            grew = total - before
            limit = self.limits.get(bucket)
            if grew > 0 and limit is not None and self.applies:
                self.inner.charge(bucket, 0.0, grew, self._limit(bucket, limit), now)
                charged += grew
        return charged

    def known(self, bucket: str, limit: TokenRate) -> None:
        """Note ``bucket``'s limit before any of its requests came here (the others' tokens are charged from now)."""
        self.limits.setdefault(bucket, limit)

    def degrade(self, routers_alive: int | None) -> None:
        """Exchanges fail: refill at 1 / ``routers_alive`` of the rate (None: they succeed again, the whole rate)."""
        self.share = 1.0 if routers_alive is None else 1.0 / max(1, routers_alive)
