"""The router's admission (router/admission/, its ``Admission`` core) driven in simulated time.

The simulator owns the waiting as router/http's gate does: a request arriving goes to ``Admission.arrive``
(shed at once with a reason, or queued); whenever room may have changed -- an arrival, a step's end (first
tokens, finishes), a waiter's deadline coming due -- the head of the queue is priced and gated (go to the
routing policy, wait, or shed), until one waits. Requests carry their tenant, priority and TTFT target
(workloads/tenants.py): the target is the request's own deadline, as the deadline header gives it live.

Room: the replicas' state as the router sees it (its in-flight requests there; running and waiting as
``/load`` reports them) through ``room.SlotCapacity``; a request priced by the policy (``predicted_ttft_s``)
would use the prediction instead. One ``Admission`` serves every simulated router (one host's routers share
their ledger and queue bound). A shed request is never served: ``SimRequest.shed_reason`` keeps the reason.
"""

from __future__ import annotations

import math
from typing import Protocol

from kvmesh.cluster.measure.sim.config import SIMULATED_MODEL, SimConfig
from kvmesh.cluster.measure.sim.replica import SimReplica
from kvmesh.cluster.measure.sim.request import SimRequest
from kvmesh.router.admission.config import AdmissionConfig
from kvmesh.router.admission.decisions import DEADLINE, GO, WAIT, Admission, Shed
from kvmesh.router.admission.ledger import LocalLedger
from kvmesh.router.admission.queue import Waiter
from kvmesh.router.admission.room import LearnedSlots, ReplicaRoom, SlotCapacity
from kvmesh.router.admission.tenants import DEFAULT_TENANT, PRIORITY_LIMIT, Tenant


class AdmissionHost(Protocol):
    """What the admission driver needs of the simulation (loop.Simulation)."""

    replicas: list[SimReplica]

    def dispatch(self, req: SimRequest, now: float) -> None:
        """Route ``req`` at ``now`` and queue it on its replica."""
        ...

    def wake_at(self, at: float) -> None:
        """Call ``SimAdmission.pump`` again at ``at`` (a waiter's deadline)."""
        ...


class SimAdmission:
    """One simulation's admission (module doc)."""

    def __init__(self, config: AdmissionConfig, host: AdmissionHost, prefill_s_per_token: float | None = None) -> None:
        self.config = config
        self.host = host
        self.prefill_s_per_token = prefill_s_per_token
        """The replicas' reported prefill rate (its inverse) to price a head with; None: not priced (free slots)."""
        self.core = Admission(config, LocalLedger(config.fair_share_half_life_s, config.max_tenants))
        self.slots = SlotCapacity()
        self.learned: dict[str, LearnedSlots] = {}
        """Simulated replica id -> what admission learned of its slots (the router keeps it on its replica record)."""
        self.limit = config.default_limit()
        self.waiters: dict[str, Waiter] = {}  # request id -> its waiter, from arrival to its answer's end
        self.queued: dict[Waiter, SimRequest] = {}  # waiter -> its request, while it waits in the router

    @property
    def num_waiting(self) -> int:
        return len(self.queued)

    def arrive(self, req: SimRequest, now: float) -> None:
        # a tenant of the workload's mix, as a key of its own would be: any priority it asks; the section's limit
        tenant = Tenant(req.tenant or DEFAULT_TENANT, limit=self.limit, min_priority=-PRIORITY_LIMIT)
        priority = self.core.priority_of(tenant, req.priority)
        deadline = self.core.deadline_of(priority, req.ttft_target_s, now)
        result = self.core.arrive(SIMULATED_MODEL, tenant, priority, req.num_prompt_tokens, deadline, now)
        if isinstance(result, Shed):
            req.shed_reason = result.reason
            return
        self.waiters[req.request_id] = result
        self.queued[result] = req
        for waiter, shed in self.core.displaced(SIMULATED_MODEL, now):  # its place went to a tenant under its share
            self._shed(waiter, shed.reason)
        if deadline is not None:
            self.host.wake_at(deadline)  # nothing waits past its deadline silently
        self.pump(now)

    def pump(self, now: float, expire: bool = False) -> None:
        """Send heads on while the gate says go; ``expire`` (a deadline came due): first shed every waiter past
        its deadline."""
        core = self.core
        if expire:
            for waiter in core.expired(SIMULATED_MODEL, now):
                self._shed(waiter, DEADLINE)
        while (head := core.head(SIMULATED_MODEL, now)) is not None:
            predicted, wait, idle = self._predicted_ttft_s(self.queued[head])
            decision = core.gate(head, predicted, self._room(now), now, idle=idle, predicted_wait_s=wait)
            if decision == WAIT:
                break
            if isinstance(decision, Shed):
                self._shed(head, decision.reason)
                continue
            assert decision == GO
            req = self._take(head)
            self.host.dispatch(req, now)
            core.went(head, req.num_prompt_tokens - req.predicted_hit_tokens, now)

    def finished(self, reqs: list[SimRequest], now: float) -> None:
        """Their answers ended: output tokens charged to their tenants."""
        for req in reqs:
            waiter = self.waiters.pop(req.request_id, None)
            if waiter is not None:
                self.core.finished(waiter, req.num_output_tokens, now)

    def _predicted_ttft_s(self, req: SimRequest) -> tuple[float | None, float | None, bool]:
        """Stand-in for the routing policy's ``RouteDecision.predicted_ttft_s`` and its wait part
        (``TTFTEstimate.wait_s``), which the HTTP gate uses; the simulated router does not price a head without
        committing it yet: on the replica with the least, the prompt tokens queued there ahead of it (of its
        priority or better: replicas schedule by priority) -- the wait -- plus this prompt, at the replicas' prefill
        rate; cache hits and decode stalls are not priced. None without a rate. Third: that replica is idle
        (nothing in flight: the gate sends a long prompt there however long its own prefill)."""
        if self.prefill_s_per_token is None:
            return None, None, False
        candidates = [(sum(r.remaining_prefill for r in (*rep.running, *rep.waiting) if r.priority <= req.priority),
                       rep.num_in_flight == 0) for rep in self.host.replicas if rep.role != "prefill"]
        queued, idle = min(candidates, key=lambda c: (c[0], not c[1]))  # the least queued, an idle one first
        rate = self.prefill_s_per_token
        return (queued + req.num_prompt_tokens) * rate, queued * rate, idle

    def _room(self, now: float) -> bool:
        """Some replica can start a request soon (room.SlotCapacity over every replica's state)."""
        room = False
        for rep in self.host.replicas:
            state = ReplicaRoom(self.learned.setdefault(rep.replica_id, LearnedSlots()), rep.num_in_flight,
                                len(rep.running), reported_waiting(rep),
                                rep.config.engine.max_num_seqs)
            room = self.slots.has_room(state, now) or room  # every replica observed: slots are learned from all
        return room

    def _take(self, waiter: Waiter) -> SimRequest:
        return self.queued.pop(waiter)

    def _shed(self, waiter: Waiter, reason: str) -> None:
        self.core.leave(waiter)
        req = self._take(waiter)
        del self.waiters[req.request_id]
        req.shed_reason = reason


def reported_waiting(rep: SimReplica) -> int:
    """The waiting requests a replica's ``/load`` would report: those its last step could not admit. The engine
    takes new requests in between steps (AsyncLLM's commands), so one sent during a step is not yet waiting."""
    started = rep.step.start_s if rep.step is not None else math.inf
    return sum(1 for r in rep.waiting if r.routed_s < started)


def make_admission(config: SimConfig, host: AdmissionHost) -> SimAdmission | None:
    """The simulation's admission with the router section's ``admission`` settings; None when ``admission`` is off
    (every request is routed on arrival)."""
    if not config.admission:
        return None
    rate = config.cost.prefill_s_per_token if config.admission_pricing == "queue" else None
    return SimAdmission(config.router.admission, host, rate)
