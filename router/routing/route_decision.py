"""What one routing decision chose, what it predicted and what it cost (``KVRouter.route`` returns it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvmesh.router.replicas.replica import Replica, ReplicaId
from kvmesh.router.routing.cost import TTFTEstimate
from kvmesh.router.routing.kv_placement import PlannedPull
from kvmesh.router.routing.receipts import RouteReceipt


@dataclass(slots=True)
class RouteDecision:
    """One routing decision and what it cost."""

    replica: Replica
    """The chosen replica's record."""
    keys: list[int]
    """The request's router keys (one per full prompt block)."""
    matched_blocks: int
    """Leading prompt blocks the chosen replica holds (real or predicted)."""
    predicted_hit_tokens: int
    """Prompt tokens the replica should report as cached (matched blocks, capped at prompt - 1)."""
    uncached_tokens: int
    """Prompt tokens the replica will still compute."""
    host_hit_tokens: int = 0
    """The part of ``predicted_hit_tokens`` the replica loads back from its host tier."""
    receipt: RouteReceipt | None = None
    """What was decided and why (router/routing/receipts.py); complete it with ``KVRouter.receipts.record_actual``."""
    timings_ns: dict[str, int] = field(default_factory=dict)
    """Nanoseconds spent per stage: hash, match, score."""
    pull: PlannedPull | None = None
    """A peer pull worth making: the chosen replica gets the holder's extra blocks (router/routing/kv_placement.py)."""
    predicted_ttft_s: float | None = None
    """The request's predicted time to first token on the chosen replica, in seconds (router/routing/cost/);
    None when the policy does not price in seconds. Router admission compares it with the request's deadline."""
    pool: frozenset | None = None
    """The replicas the request could go to (those serving its model, router/routing/model_pools.py); None: all.
    A P/D split and a peer pull stay inside it."""
    decided_at_ns: int = 0
    """``time.perf_counter_ns()`` when the route began: a request's observed TTFT is counted from here, so the time
    between a decision and its dispatch (router admission's grant, the event loop's turn) is in it, as its client
    sees it."""
    estimate: TTFTEstimate | None = None
    """The chosen replica's estimate by part (router/routing/cost/; None: not priced); ``KVRouter.observe_ttft``
    learns from it."""
    held_blocks: int = 0
    """Leading prompt blocks the chosen replica's GPU pool held when it was decided (its matches trusted or not)."""
    sequences: int = 1
    """Sequences the request runs there (its prompts x the larger of ``n`` and ``best_of``): what it takes of the
    replica's slots, counted in its ``in_flight`` as the replica counts its running requests (ProxyRequest.route)."""
    index_version: int = -1
    """The index's version then (router/routing/predictions.py; -1: unknown): while it is current and no prediction
    is due, ``KVRouter.commit`` credits the replica from ``held_blocks`` without matching again."""
    prediction: int | None = None
    """The ticket of its prompt's held prediction (``KVRouter.predict_hold_s``), released when the replica sends its
    first bytes or the request leaves it (``KVRouter.release_prediction``); None: a plain prediction, or none."""

    @property
    def replica_id(self) -> ReplicaId:
        """The chosen replica's id (for the edges: headers, logs, metrics)."""
        return self.replica.id
