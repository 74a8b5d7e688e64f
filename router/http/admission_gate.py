"""Admission on the data plane: a request waits in the router, not in a replica's queue, until a replica can
start it soon; it is shed at once (429) when it cannot be served in time or its tenant is over its limit.

    Forwarder.handle: read (validate, tokenize) -> AdmissionGate.admit -> Forwarder.forward -> AdmissionGate.answered
    admit:  tenant and priority (the proxy's, from the credentials: router/http/caller.py),
            deadline (``x-kvmesh-ttft-deadline-ms``, else its priority class's) -> Admission.arrive
            (router/admission/decisions.py) -> wait until ``pump`` lets it go -> its ``Ticket``: the proxy
            forwards it with the route that let it go (counted in the replica's load from that moment)
    answered: its output charged when it ends

``pump(model)`` runs whenever room may have changed (an arrival, a request's end, every ``recheck_interval_s`` while
requests wait: admission_ticker.py): it routes the queue's head (``ProxyRequest.route``: dispatch's call, without
crediting the replica until it goes) and asks ``Admission.gate`` with the route's ``predicted_ttft_s`` (the part
spent waiting held to ``admit_ttft_s``) and whether the chosen replica has a free slot, or, unpriced, whether some
candidate replica has one (router/admission/room.py); a head held for a busy replica while another replica is idle
is not held (``hold_while_idle`` off): it goes where its predicted TTFT is sooner, that replica or the idle one the
policy prefers (idle_route.py); it goes on with the next head until one must wait. A head that must wait holds back
only its replica: the next of the queue's ``lookahead`` waiters routed elsewhere goes first; each that waits counts
in its replica's load meanwhile (held_load.py). A client that leaves while waiting leaves the queue at once (its
coroutine is cancelled); one whose deadline passes while waiting gets its 429 then, as does one whose place a tenant
under its share of the full queue took (router/admission/queue_share.py). With no replica to route to, a request
goes on (dispatch's 503, as without it).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING, cast

import msgspec
from kvmesh.replica.serving.errors import error_body
from kvmesh.router.admission.decisions import DEADLINE, GO, WAIT, Admission, Shed
from kvmesh.router.admission.ledger import LocalLedger, TenantLedger
from kvmesh.router.admission.room import SlotCapacity
from kvmesh.router.http.admission_metrics import AdmissionMetrics
from kvmesh.router.http.admission_ticker import Ticker
from kvmesh.router.http.admission_ticket import Ticket, Waiting, future_of, waiting_of
from kvmesh.router.http.caller import int_header
from kvmesh.router.http.held_load import HeldLoad
from kvmesh.router.http.idle_route import sooner_while_idle
from kvmesh.router.http.messages import HttpRequest, Response
from kvmesh.router.http.replica_room import is_idle, room_of
from kvmesh.router.routing.policies import NoReplicaError

if TYPE_CHECKING:
    from kvmesh.router.admission.config import AdmissionConfig
    from kvmesh.router.admission.queue import Waiter
    from kvmesh.router.admission.tenants import Tenants
    from kvmesh.router.http.proxy_request import ProxyRequest
    from kvmesh.router.replicas.replica import Replica
    from kvmesh.router.routing.kv_router import KVRouter, RouteDecision
    from prometheus_client import CollectorRegistry

DEADLINE_HEADER = b"x-kvmesh-ttft-deadline-ms"
"""The request's own TTFT deadline in milliseconds (overrides its priority class's)."""
_COMPLETION_TOKENS = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')


class AdmissionGate:
    """The router's admission (module doc); ``share`` puts its ledger in shared memory (``router.workers`` > 1)."""

    def __init__(self, config: AdmissionConfig, tenants: Tenants, router: KVRouter,
                 registry: CollectorRegistry) -> None:
        self.config = config
        self.tenants = tenants
        self.router = router
        self.admission = Admission(config, LocalLedger(config.fair_share_half_life_s, config.max_tenants))
        self.slots = SlotCapacity(config.slots_ttl_s)
        self.metrics = AdmissionMetrics(registry, config)
        self.held = HeldLoad()  # the waiters that wait for their replica, in its load (held_load.py)
        self.ticker = Ticker(config.recheck_interval_s, lambda model: bool(self.admission.queues.get(model)),
                             lambda model: self.pump(model))
        self.granted = 0
        """Requests let go whose tasks have not yet run to their dispatch (into their replica's load): no other is
        let go meanwhile, since the room they take is not counted yet."""

    def share(self, ledger: TenantLedger) -> None:
        """Keep usage, buckets and queue lengths in ``ledger`` (router/admission/shared_ledger.py)."""
        self.admission.ledger = ledger

    # ---------------------------------------------------------------- one request
    async def admit(self, http: HttpRequest, request: ProxyRequest) -> Ticket | Response:
        """Wait until ``request`` may go (its ticket: forward it with ``ticket.decision`` inside ``charged``), or
        its 429 (module doc)."""
        labels, got = self._arrive(http, request)
        if isinstance(got, Shed):
            return self._refuse(got, labels)
        ticket = self._at_once(got, labels) or await self._wait(got, labels)
        if isinstance(ticket, Shed):
            return self._refuse(ticket, labels)
        m = self.metrics
        m.admitted.labels(*labels).inc()
        m.tokens.labels(labels[0], "prompt").inc(got.prompt_tokens)
        if ticket.decision is not None:
            m.tokens.labels(labels[0], "computed").inc(ticket.decision.uncached_tokens)
        return ticket

    def answered(self, ticket: Ticket, response: Response, request: ProxyRequest) -> Response:
        """``ticket``'s answer, charged with its output when it ends (a stream's when it is over). A forward that
        fails instead (or is cancelled) calls ``finished(ticket, 0)``: nothing charged, its room given on. Its
        grammar compiles are charged now (compile_charge.py)."""
        if request.compile_tokens:
            self.admission.charge_compile(ticket.waiter, request.compile_tokens, time.monotonic())
        if response.stream is None:
            found = _COMPLETION_TOKENS.findall(response.body) if response.status == 200 else []
            self.finished(ticket, int(found[-1]) if found else 0)
            return response
        labels = self.metrics.labels(ticket.waiter.tenant, ticket.waiter.priority)
        self.metrics.ttft.labels(*labels).observe(time.perf_counter() - ticket.start)
        response.stream = self._watch(ticket, response.stream, request)
        return response

    def finished(self, ticket: Ticket, output_tokens: int) -> None:
        """``ticket``'s request ended after ``output_tokens`` (0: failed): charged, and its room given on."""
        waiter = ticket.waiter
        self.admission.finished(waiter, output_tokens, time.monotonic())
        self.metrics.tokens.labels(self.metrics.tenant(waiter.tenant), "output").inc(output_tokens)
        self.pump(waiter.model)

    async def _watch(self, ticket: Ticket, body: AsyncIterator[bytes], request: ProxyRequest) -> AsyncIterator[bytes]:
        try:
            async for chunk in body:
                yield chunk
        finally:
            try:
                if isinstance(body, AsyncGenerator):  # the relay's is
                    await body.aclose()  # the relay lets go of its replica (its load) first: then the room is free
            finally:
                self.finished(ticket, request.stream.num_output if request.stream is not None else 0)

    def _arrive(self, http: HttpRequest, request: ProxyRequest) -> tuple[tuple[str, str], Waiter | Shed]:
        """The request's metric labels (tenant, priority) and its place in the queue, or why it is shed."""
        tenant, priority = request.tenant, request.priority
        deadline_ms = int_header(http, DEADLINE_HEADER, "a positive integer of milliseconds", positive=True)
        now = time.monotonic()
        adm, model = self.admission, request.req.model or ""
        deadline = adm.deadline_of(priority, None if deadline_ms is None else deadline_ms / 1000, now)
        at_once = not self.granted and adm.may_go_at_once(model)  # tried before it is queued (``_at_once``)
        got = adm.arrive(model, tenant, priority, sum(map(len, request.prompts)), deadline, now, queued=not at_once)
        if not isinstance(got, Shed):
            got.payload = Waiting(request, time.perf_counter(), at_once=at_once)
            self._answer_displaced(model, now)
        return self.metrics.labels(tenant.name, priority), got

    def _at_once(self, waiter: Waiter, labels: tuple[str, str]) -> Ticket | Shed | None:
        """With nothing else waiting for its model and no one let go still on its way, ``waiter`` is the head the
        pump would try now: tried here, before it is queued and without a future (None: it waits, queued now;
        ``_wait``)."""
        waiting = waiting_of(waiter)
        if not waiting.at_once:
            return None
        verdict = self._try(waiter, waiting, time.monotonic())
        if verdict == WAIT:
            self.admission.enqueue(waiter)
            waiting.priced = True
            return None
        self.metrics.queue_seconds.labels(labels[1]).observe(time.perf_counter() - waiting.start)
        if isinstance(verdict, Shed):
            return verdict
        return Ticket(waiter, cast("RouteDecision | None", verdict), waiting.start)

    async def _wait(self, waiter: Waiter, labels: tuple[str, str]) -> Ticket | Shed:
        waiting = waiting_of(waiter)
        if not waiting.priced:  # ``_at_once`` asked the gate already: the pump would find the same
            self.pump(waiter.model)
        try:
            return await self._await_turn(waiter, waiting, labels)
        finally:
            if waiting.granted:  # it runs to its dispatch now, without yielding to the loop (a split's prefill aside)
                waiting.granted = False
                self.granted -= 1

    async def _await_turn(self, waiter: Waiter, waiting: Waiting, labels: tuple[str, str]) -> Ticket | Shed:
        future = future_of(waiter)
        if not future.done():
            m = self.metrics
            m.queued.labels(*labels).inc()
            gauge = m.waiting.labels(*labels)
            gauge.inc()
            loop = asyncio.get_running_loop()
            if waiter.deadline is not None:
                waiting.timer = loop.call_at(loop.time() + waiter.deadline - time.monotonic(), self._expire, waiter)
            self.ticker.start(waiter.model)
            try:
                await future
            except asyncio.CancelledError:  # the client left: out of the queue at once
                self.admission.leave(waiter)
                raise
            finally:
                gauge.dec()
                if waiting.timer is not None:
                    waiting.timer.cancel()
        self.metrics.queue_seconds.labels(labels[1]).observe(time.perf_counter() - waiting.start)
        result = future.result()
        return result if isinstance(result, Shed) else Ticket(waiter, result, waiting.start)

    def _expire(self, waiter: Waiter) -> None:
        """Its deadline passed while it waited: shed (nothing waits past its deadline)."""
        future = future_of(waiter)
        if future.done():
            return
        self.admission.leave(waiter)
        now = time.monotonic()
        future.set_result(Shed(DEADLINE, self.admission.retry_after(waiter.model, waiter.priority, now, waiter.tenant),
                               f"deadline unreachable: waited {now - waiter.arrival:.3g} s in the router's queue, "
                               f"its TTFT deadline of {waiter.deadline - waiter.arrival:.3g} s passed; retry later"))

    def _refuse(self, shed: Shed, labels: tuple[str, str]) -> Response:
        self.metrics.shed.labels(*labels, shed.reason).inc()
        body = error_body(shed.message, 429)
        body["error"]["type"] = shed.reason
        return Response(msgspec.json.encode(body), 429, headers={"retry-after": shed.retry_after_header})

    # ---------------------------------------------------------------- the queue
    def pump(self, model: str) -> None:
        """Let ``model``'s waiters go while the gate says so (module doc), one at a time: the next once the one let
        go has run to its dispatch (it is in its replica's load by then)."""
        self._answer_displaced(model, time.monotonic())
        while not self.granted and self._pump_one(model, time.monotonic()):
            pass

    def _pump_one(self, model: str, now: float) -> bool:
        """Let one waiter go, or take one out: the first of the queue's ``lookahead`` (in serving order) that the gate
        lets go and whose replica no waiter before it waits for, so a replica's requests go in the queue's order
        and a busy one holds back only its own. False: none may go now."""
        blocked: set[str] = set()
        self.held.release(model)
        for waiter in self.admission.in_order(model, now, self.config.lookahead):
            waiting, future = waiting_of(waiter), future_of(waiter)
            if future.done():  # answered meanwhile (cancelled)
                self.admission.leave(waiter)
                return True
            verdict = self._try(waiter, waiting, now, blocked)
            if verdict == WAIT:
                continue
            if isinstance(verdict, Shed):
                future.set_result(verdict)
                return True
            waiting.granted = True
            self.granted += 1
            future.set_result(verdict)  # its task runs to its dispatch, then the next pump
            asyncio.get_running_loop().call_soon(self.pump, model)
            return True
        return False

    def _try(self, waiter: Waiter, waiting: Waiting, now: float,
             blocked: set[str] | None = None) -> RouteDecision | None | str | Shed:
        """WAIT (held in its replica's load, the replica added to ``blocked``; at once where a waiter before it waits
        for it), a ``Shed`` (out of the queue), or the route that lets it go (None: no replica, dispatch's 503)."""
        adm = self.admission
        try:
            decision = waiting.request.route(self.router, [], commit=False)  # a price: it may not go yet
        except NoReplicaError:  # nothing to wait for: dispatch answers 503
            decision = None
        chosen = None if decision is None else decision.replica
        if blocked is not None and chosen is not None and chosen.id in blocked:
            self.held.hold(waiter.model, chosen, decision.uncached_tokens)
            return WAIT
        room = self._room(now, chosen if decision is not None and decision.predicted_ttft_s is not None else None)
        verdict = GO if decision is None else adm.gate(
            waiter, decision.predicted_ttft_s, room, now, idle=is_idle(chosen),
            predicted_wait_s=None if decision.estimate is None else decision.estimate.wait_s)
        if (verdict == WAIT and chosen is not None and not self.config.hold_while_idle
                and (spare := sooner_while_idle(self.router, waiting.request, decision)) is not None):
            decision, chosen = spare, spare.replica  # the fleet has room: nothing waits in the router
            verdict = adm.gate(waiter, decision.predicted_ttft_s, True, now, idle=True)
        if verdict == WAIT:
            if chosen is not None:
                self.held.hold(waiter.model, chosen, decision.uncached_tokens)
                if blocked is not None:
                    blocked.add(chosen.id)
            return WAIT
        if isinstance(verdict, Shed):
            adm.leave(waiter)
            return verdict
        if decision is not None:
            self.router.commit(decision, waiting.request.session_id)
        adm.went(waiter, 0 if decision is None else decision.uncached_tokens, now)
        return decision

    def _answer_displaced(self, model: str, now: float) -> None:
        """Waiters that lost their place to a tenant under its share get their 429 (router/admission/queue_share.py)."""
        for waiter, shed in self.admission.displaced(model, now):
            future = future_of(waiter)
            if not future.done():
                future.set_result(shed)

    def _room(self, now: float, chosen: Replica | None = None) -> bool:
        """Whether ``chosen`` (None: some decode candidate) has a free slot (router/admission/room.py)."""
        replicas = self.router.replicas.candidates() if chosen is None else [chosen] if chosen.routable else []
        return any(self.slots.has_room(room_of(replica), now) for replica in replicas)
