"""``Admission``: what happens to a request that arrives, waits and ends -- the decisions, no I/O, no clock.

    arrive(model, tenant, asked priority, prompt tokens, deadline header, now)
        -> Shed (429 at once: queue full, tenant over limit, deadline unreachable)   | Waiter (queued)
           a full queue refuses a tenant at or over its share of the places; one under it takes the place of
           the newest waiter of the tenant most over its share (queue_share.py)
    displaced(model, now)             waiters that lost their place since last asked: each answered 429 now
    head(model, now)                  the waiter to try next (priority, then fair share, then arrival)
    gate(waiter, predicted ttft, room, now)
        -> GO (send it: a replica can start it soon) | WAIT | Shed (deadline unreachable, or passed)
    went(waiter, computed prompt tokens, now)     it left the queue for a replica: fair share charged
    leave(waiter)                                 shed or its client left: out of the queue at once
    finished(waiter, output tokens, now)          output charged (x2 in fair share, and to its bucket)

The caller (router/http/admission_gate.py; the simulator) owns the waiting: it asks ``head``, prices
the head (``predicted_ttft_s``, or ``room.SlotCapacity``), and calls ``gate`` whenever room may have
changed (a request ended, a timer). Only the head is tried, so the order here is the order served.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from kvmesh.router.admission.config import AdmissionConfig
from kvmesh.router.admission.fair_share import OUTPUT_WEIGHT, PROMPT_WEIGHT
from kvmesh.router.admission.ledger import NO_PRIORITY, TenantLedger
from kvmesh.router.admission.queue import AdmissionQueue, Waiter
from kvmesh.router.admission.queue_share import place_in_full_queue, share_of
from kvmesh.router.admission.room import DrainRate
from kvmesh.router.admission.tenants import Tenant

QUEUE_FULL, OVER_LIMIT, DEADLINE = "queue_full", "tenant_over_limit", "deadline_unreachable"
SHED_REASONS = (QUEUE_FULL, OVER_LIMIT, DEADLINE)
"""Why a request is answered 429 (the ``reason`` label of the shed metric)."""
GO, WAIT = "go", "wait"


@dataclass(slots=True, frozen=True)
class Shed:
    """A request refused now: 429 with ``Retry-After`` and a message naming the reason."""

    reason: str
    """One of ``SHED_REASONS``."""
    retry_after_s: float
    """When trying again may succeed (the predicted drain time, or the bucket's refill)."""
    message: str
    """For people: what was exceeded and what to do."""

    @property
    def retry_after_header(self) -> str:
        """``Retry-After`` in whole seconds, at least 1."""
        return str(max(1, math.ceil(self.retry_after_s)))


class Admission:
    """The admission decisions of one router process (module doc); ``ledger`` is shared when processes are."""

    def __init__(self, config: AdmissionConfig, ledger: TenantLedger) -> None:
        self.config = config
        self.ledger = ledger
        self.queues: dict[str, AdmissionQueue] = {}
        self.drains: dict[str, DrainRate] = {}
        self._displaced: list[tuple[Waiter, Shed]] = []

    # ---------------------------------------------------------------- arrival
    def priority_of(self, tenant: Tenant, asked: int | None) -> int:
        """The request's priority: what it asked (header or body), else its tenant's default; never better than
        the tenant's ``min_priority`` (``Tenant.grant``, as the router's proxy grants it)."""
        return tenant.grant(asked)

    def deadline_of(self, priority: int, header_s: float | None, now: float) -> float | None:
        """When its first token is due: the header's deadline, else its priority class's (None: none)."""
        seconds = header_s if header_s is not None else self.config.class_deadline_s(priority)
        return None if seconds is None else now + seconds

    def may_go_at_once(self, model: str) -> bool:
        """Whether an arrival for ``model`` finds nothing of it waiting here, no place owed and room in the queue: the
        caller may then try it before queueing it (``arrive(..., queued=False)``), as the queue's only waiter."""
        return not self.queues.get(model) and self.ledger.queued(model) < self.config.max_queued \
            and not self.ledger.debts(model)

    def arrive(self, model: str, tenant: Tenant, priority: int, prompt_tokens: int, deadline: float | None,
               now: float, queued: bool = True) -> Waiter | Shed:
        """Queue the request, or shed it at once (queue bound and the tenant's share of it, then deadline, then the
        tenant's bucket: a shed request takes no tokens and no one's place). ``queued=False`` (``may_go_at_once``):
        not queued yet; the caller tries it at once and ``enqueue``s it if it must wait."""
        queue = self.queues.setdefault(model, AdmissionQueue())
        drain = self.drains.setdefault(model, DrainRate())
        usage = functools.partial(self.ledger.usage, now=now)
        ahead = queue.ahead_of(priority, tenant.name, usage)
        wait_s = drain.wait_s(ahead, now)
        place = None
        if self.ledger.queued(model) >= self.config.max_queued:
            place = place_in_full_queue(self.ledger.waiting_by_tenant(model), self.ledger.counted_as(tenant.name),
                                        self.config.max_queued, usage)
            if place.displace is None:
                return Shed(QUEUE_FULL, wait_s or 1.0,
                            f"the router's queue for model {model!r} is full ({self.config.max_queued} places) and "
                            f"tenant {tenant.name!r} has {place.waiting} requests waiting in it, at or over its share "
                            f"of {place.share:.3g} places; retry after Retry-After seconds")
        if deadline is not None and wait_s is not None and now + wait_s > deadline:
            return Shed(DEADLINE, wait_s, f"deadline unreachable: the TTFT deadline of {deadline - now:.3g} s "
                        f"cannot be met ({ahead} requests go on before it, about {wait_s:.3g} s); "
                        "retry later or allow a longer deadline")
        if tenant.limit is not None:
            refill_s = self.ledger.try_take(tenant.bucket, prompt_tokens, tenant.limit, now)
            if refill_s > 0:
                return Shed(OVER_LIMIT, refill_s,
                            f"tenant {tenant.bucket!r} over limit: {tenant.limit.tokens_per_s:g} tokens/s "
                            f"(burst {tenant.limit.burst_tokens:g}); this request's {prompt_tokens} prompt tokens "
                            f"fit in {refill_s:.3g} s")
        waiter = Waiter(model, tenant.name, priority, now, deadline, prompt_tokens, tenant.limit, tenant.parent)
        if queued:
            self.enqueue(waiter)
            if place is not None and place.displace is not None:  # None: shed above
                self._displace(model, place.displace, now)
                self._publish(model)
        return waiter

    def enqueue(self, waiter: Waiter) -> None:
        """Put an arrival in its queue (``arrive`` does, unless told not to)."""
        self.queues[waiter.model].push(waiter)
        self.ledger.waiting_changed(waiter.model, waiter.tenant, 1)
        self._publish(waiter.model)

    def _displace(self, model: str, tenant: str, now: float) -> None:
        """An arrival takes a place of ``tenant``'s: its newest waiter here goes, or, with none here, the place is
        owed (another router process displaces one of its waiters: ``displaced``)."""
        waiter = self.queues[model].newest_of(tenant)
        if waiter is None:
            self.ledger.owe(model, tenant)
        else:
            self._lose_place(waiter, now)

    def displaced(self, model: str, now: float) -> list[tuple[Waiter, Shed]]:
        """Waiters of ``model`` that lost their place since last asked, each with its 429 (the caller answers them):
        displaced by an arrival here, or here for a place their tenant owes an arrival in another process."""
        queue = self.queues.get(model)
        debts = self.ledger.debts(model) if queue else {}
        for tenant, owed in debts.items():
            for _ in range(owed):
                waiter = queue.newest_of(tenant) if queue else None
                if waiter is None or not self.ledger.pay_debt(model, tenant):
                    break
                self._lose_place(waiter, now)
        if not self._displaced:  # the usual case: asked on every arrival and pump
            return []
        mine = [d for d in self._displaced if d[0].model == model]
        self._displaced = [d for d in self._displaced if d[0].model != model]
        return mine

    def _lose_place(self, waiter: Waiter, now: float) -> None:
        model, tenant = waiter.model, waiter.tenant
        self.queues[model].remove(waiter)
        self.ledger.waiting_changed(model, tenant, -1, pay=False)
        self._publish(model)
        waiting = self.ledger.waiting_by_tenant(model)
        self._displaced.append((waiter, Shed(
            QUEUE_FULL, self.retry_after(model, waiter.priority, now, tenant),
            f"the router's queue for model {model!r} is full ({self.config.max_queued} places) and tenant {tenant!r} "
            f"had {waiting.get(tenant, 0) + 1} requests waiting in it, over its share of "
            f"{share_of(waiting, tenant, self.config.max_queued):.3g} places: a tenant under its share took this "
            "one's place; retry after Retry-After seconds")))

    # ---------------------------------------------------------------- waiting
    def head(self, model: str, now: float) -> Waiter | None:
        queue = self.queues.get(model)
        if not queue:  # none, or empty: no usage to look up
            return None
        return queue.head(functools.partial(self.ledger.usage, now=now))  # queue -> ledger, never back here

    def in_order(self, model: str, now: float, limit: int) -> list[Waiter]:
        """Up to ``limit`` of ``model``'s waiters in about the order they are served (``head`` first)."""
        queue = self.queues.get(model)
        return queue.in_order(functools.partial(self.ledger.usage, now=now), limit) if queue else []

    def gate(self, waiter: Waiter, predicted_ttft_s: float | None, room: bool, now: float,
             idle: bool = False, predicted_wait_s: float | None = None) -> str | Shed:
        """GO, WAIT or Shed for the head ``waiter``: ``predicted_ttft_s`` on its best replica (None: not priced),
        ``room``: the replica it would go to has a free slot (room.py; unpriced: some candidate has) -- a priced
        request goes on only where it starts at once, so the order decided here is the order served and a
        prediction that is short of the truth cannot pile requests up in a replica's queue; ``idle``: that best
        replica has nothing
        in flight or waiting, so its prediction is the request's own prefill (a long prompt goes on however long);
        ``predicted_wait_s``: the part of the prediction spent behind the work already there (``TTFTEstimate.wait_s``)
        -- what is held to ``admit_ttft_s`` when given (its own prefill is no reason to wait), the whole prediction
        when not. The deadline is judged on the whole prediction."""
        if waiter.deadline is not None:
            late = now >= waiter.deadline
            if late or (predicted_ttft_s is not None and now + predicted_ttft_s > waiter.deadline):
                waited = now - waiter.arrival
                why = (f"waited {waited:.3g} s, its deadline passed" if late else
                       f"the fastest replica's predicted TTFT is {predicted_ttft_s:.3g} s, "
                       f"{waiter.deadline - now:.3g} s are left")
                return Shed(DEADLINE, self.retry_after(waiter.model, waiter.priority, now, waiter.tenant),
                            f"deadline unreachable: {why} (TTFT deadline {waiter.deadline - waiter.arrival:.3g} s); "
                            "retry later or allow a longer deadline")
        if self.ledger.better_elsewhere(waiter.model, waiter.priority):
            return WAIT  # another router process holds a more urgent request: the room is its
        if predicted_ttft_s is None:
            return GO if room else WAIT
        soon = predicted_ttft_s if predicted_wait_s is None else predicted_wait_s
        return GO if idle or (room and soon <= self.config.admit_ttft_s) else WAIT

    def waiting(self) -> int:
        """Requests waiting in every router process of the host for a model this process has queued (the demand the
        replicas' in-flight counts do not show: ``GET /replicas`` ``waiting``, which the autoscaler adds to them)."""
        return sum(self.ledger.queued(model) for model in self.queues)

    def expired(self, model: str, now: float) -> list[Waiter]:
        """Waiters whose deadline has passed (the caller sheds each: nothing waits past its deadline)."""
        queue = self.queues.get(model)
        return [] if queue is None else [w for w in queue if w.deadline is not None and w.deadline <= now]

    def retry_after(self, model: str, priority: int, now: float, tenant: str = "") -> float:
        """Seconds until the waiters now ahead of a new ``priority`` request of ``tenant`` have gone on (1 when
        unknown)."""
        queue, drain = self.queues.get(model), self.drains.get(model)
        if queue is None or drain is None:
            return 1.0
        ahead = queue.ahead_of(priority, tenant, functools.partial(self.ledger.usage, now=now))
        return drain.wait_s(ahead + 1, now) or 1.0

    # ---------------------------------------------------------------- leaving
    def went(self, waiter: Waiter, computed_prompt_tokens: int, now: float) -> None:
        """``waiter`` left the queue for a replica, where it computes ``computed_prompt_tokens`` (x1 in its usage;
        its bucket took the prompt at arrival)."""
        self.leave(waiter)
        queue = self.queues.get(waiter.model)
        self.drains[waiter.model].record(now, still_waiting=bool(queue))
        self.ledger.charge(waiter.tenant, PROMPT_WEIGHT * computed_prompt_tokens, 0, None, now)

    def leave(self, waiter: Waiter) -> None:
        """Out of the queue (shed, its client left, or gone on); a no-op when it is not in."""
        queue = self.queues.get(waiter.model)
        if queue is not None and queue.remove(waiter):
            self.ledger.waiting_changed(waiter.model, waiter.tenant, -1)
            self._publish(waiter.model)

    def charge_compile(self, waiter: Waiter, compile_tokens: float, now: float) -> None:
        """Its grammar compiles, as the prompt tokens their seconds are worth (router/http/compile_charge.py): x1
        in its usage, never from its bucket (a rate limit counts the tokens a tenant sends and gets)."""
        self.ledger.charge(waiter.tenant, PROMPT_WEIGHT * compile_tokens, 0, None, now)

    def finished(self, waiter: Waiter, output_tokens: int, now: float) -> None:
        """Its answer ended after ``output_tokens``: x2 in its usage, and taken from its bucket (its key's)."""
        if waiter.bucket is None:
            self.ledger.charge(waiter.tenant, OUTPUT_WEIGHT * output_tokens, output_tokens, waiter.limit, now)
            return
        self.ledger.charge(waiter.tenant, OUTPUT_WEIGHT * output_tokens, 0, None, now)
        self.ledger.charge(waiter.bucket, 0.0, output_tokens, waiter.limit, now)

    def _publish(self, model: str) -> None:
        queue = self.queues[model]
        best = queue.best_priority
        self.ledger.publish_queue(model, len(queue), NO_PRIORITY if best is None else best)
