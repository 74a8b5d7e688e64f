"""What a replica counts of the requests it accepted, for the load it publishes (events/load.py).

    accept(booking, prompt_tokens, uncached_tokens, now)   a request joined the replica's queue
    withdraw(prompt_tokens, uncached_tokens, at, now)      it was refused before it ran: its intake taken back
    cache_reset()                                          its prefix cache was reset: the decayed sums restart
    update(now, running, waiting, queued, kv_usage, ...)   the ``ReplicaLoadUpdate`` to publish now

Per router id, the highest booking number accepted (``x-kvmesh-router``, router/replicas/bookings.py), so each
router subtracts its own bookings the replica counts; and the fleet-wide rates a router alone sees only its share
of: requests per second (decayed over ``ARRIVAL_TAU_S``, as ``ReplicaLoad.arrival_rate``) and the uncached prompt
tokens, prompt tokens and requests accepted, decayed over ``CHURN_TAU_S`` (its cache's turnover and hit fraction,
as ``ReplicaLoad.recent_*``).
"""

from __future__ import annotations

import math
from collections import OrderedDict

from kvmesh.events.load import ReplicaLoadUpdate, new_epoch

__all__ = ["ARRIVAL_TAU_S", "CHURN_TAU_S", "LoadLedger", "MAX_ROUTERS"]

ARRIVAL_TAU_S = 30.0
"""Time constant of the published request rate (the router's ``ARRIVAL_TAU_S``)."""
CHURN_TAU_S = 300.0
"""Time constant of the published decayed prompt sums (the router's default ``churn_tau_s``)."""
MAX_ROUTERS = 256
"""Router ids a replica keeps accepted numbers for; the least recently seen is forgotten beyond it."""


class LoadLedger:
    """The accepted booking numbers and decayed sums of one replica (one thread calls it, or a lock is held)."""

    def __init__(self) -> None:
        self.accepted: OrderedDict[str, int] = OrderedDict()
        """Router id -> highest booking number accepted, least recently seen first."""
        self.epoch = new_epoch()
        """This run's epoch (``ReplicaLoadUpdate.epoch``): the ledger's updates are numbered within it."""
        self.seq = 0
        """Updates made so far (the next update's ``seq``)."""
        self.arrival_rate = 0.0
        self._sums = [0.0, 0.0, 0.0]  # uncached prompt tokens, prompt tokens, requests, decayed to ``_at``
        self._at: float | None = None

    def accept(self, booking: tuple[str, int] | None, prompt_tokens: int, uncached_tokens: int, now: float) -> None:
        """A request joined the queue at ``now`` (seconds, any clock the updates use too); ``booking``: its
        router's (id, number), None for a request no router booked."""
        if booking is not None:
            router_id, number = booking
            accepted = self.accepted
            if number > accepted.get(router_id, 0):
                accepted[router_id] = number
            accepted.move_to_end(router_id)
            while len(accepted) > MAX_ROUTERS:
                accepted.popitem(last=False)
        gap = self._decay(now)
        self.arrival_rate = self.arrival_rate * math.exp(-gap / ARRIVAL_TAU_S) + 1 / ARRIVAL_TAU_S
        sums = self._sums
        sums[0] += uncached_tokens
        sums[1] += max(prompt_tokens, uncached_tokens)
        sums[2] += 1

    def withdraw(self, prompt_tokens: int, uncached_tokens: int, accepted_at: float, now: float) -> None:
        """A request ``accept`` counted at ``accepted_at`` was refused before it ran (the engine's 400 or 503): its
        intake leaves the decayed sums, as it decayed since (its booking stays accepted: the router counted it, and
        must stop counting it)."""
        self._decay(now)
        left = math.exp(-max(0.0, now - accepted_at) / CHURN_TAU_S)
        taken = (uncached_tokens, max(prompt_tokens, uncached_tokens), 1)
        self._sums = [max(0.0, s - t * left) for s, t in zip(self._sums, taken, strict=True)]

    def cache_reset(self) -> None:
        """The replica's prefix cache was reset: the decayed prompt sums start afresh. They describe what its cache
        took in (how young its LRU tail is, its hit fraction), and those blocks are gone; a router adopting them
        would price an empty cache by the intake of the one before (after a benchmark's reset between arms, the
        previous arm's traffic)."""
        self._sums = [0.0, 0.0, 0.0]

    def _decay(self, now: float) -> float:
        gap = 0.0 if self._at is None else max(0.0, now - self._at)
        if gap:
            shrink = math.exp(-gap / CHURN_TAU_S)
            self._sums = [s * shrink for s in self._sums]
        self._at = now if self._at is None else max(self._at, now)
        return gap

    def update(self, now: float, ts: float, num_running: int, num_waiting: int, queued_prefill_tokens: int,
               kv_usage: float, prefill_tokens_per_s: float | None = None, decode_step_s: float | None = None,
               engine_steps: int = 0) -> ReplicaLoadUpdate:
        """The update to publish at ``now`` (the clock of ``accept``; ``ts``: wall-clock seconds)."""
        arrival_gap = 0.0 if self._at is None else max(0.0, now - self._at)
        rate = self.arrival_rate * math.exp(-arrival_gap / ARRIVAL_TAU_S)
        self._decay(now)
        self.arrival_rate = rate
        seq, self.seq = self.seq, self.seq + 1
        uncached, prompt, requests = self._sums
        return ReplicaLoadUpdate(
            ts=ts, seq=seq, num_running=num_running, num_waiting=num_waiting,
            queued_prefill_tokens=queued_prefill_tokens, kv_usage=kv_usage, accepted=dict(self.accepted),
            prefill_tokens_per_s=prefill_tokens_per_s, decode_step_s=decode_step_s, engine_steps=engine_steps,
            arrival_rate=rate, recent_prefill=uncached, recent_prompt=prompt, recent_requests=requests,
            churn_tau_s=CHURN_TAU_S, epoch=self.epoch)
