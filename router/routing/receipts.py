"""Route receipts: what the router decided for a request, why, and what the engine then reported.

A receipt is made by ``KVRouter.route`` (``RouteDecision.receipt``) and completed with the
replica's ``usage.prompt_tokens_details.cached_tokens`` (``Receipts.record_actual``). From the
receipts the router reports its headline numbers:

- *captured / available reuse*: cached tokens the replicas reported ÷ the best hit any healthy
  replica offered when each request was routed (cluster-wide and per chosen replica);
- *predicted ≠ actual*: the fraction of requests whose reported hit differed from the router's
  prediction for the chosen replica (a stale index, an eviction between routing and admission,
  or a replica whose hashing does not match the router's).

Reasons (``RouteReceipt.reason``):

    cache     the chosen replica offered the best hit of any candidate, and it was > 0
    load      load decided: the policy sent the request away from a better hit to balance
              load, or no candidate held any of the prompt
    session   the request's session kept it on its replica (router/routing/session.py)
    fallback  the router had no usable cache information: a retry after a failed replica, or
              the chosen replica is degraded (load-only routing)

The HTTP layer sends ``RouteReceipt.headers()`` (names ``x-kvmesh-*``) when the client opts in,
and logs ``RouteReceipt.log_fields()`` in its access log. Nothing here does I/O or imports torch.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kvmesh.kvcache.reuse import reusable_tokens
from kvmesh.router.replicas.replica import READY, Replica, ReplicaId
from kvmesh.router.replicas.replica_set import ReplicaSet
from kvmesh.router.replicas.reuse import REASONS, ReuseTotals
from kvmesh.router.routing.ceiling import LiveCeiling
from kvmesh.router.routing.tier_matches import TierMatches

__all__ = ["Receipts", "RouteReceipt", "receipt_headers"]

HEADER_PREFIX = "x-kvmesh-"
HEADER_REPLICA = HEADER_PREFIX + "replica"
HEADER_REASON = HEADER_PREFIX + "route-reason"
HEADER_PREDICTED = HEADER_PREFIX + "predicted-hit-tokens"
HEADER_BEST = HEADER_PREFIX + "best-hit-tokens"
HEADER_PROMPT = HEADER_PREFIX + "prompt-tokens"
HEADER_PREDICTED_HOST = HEADER_PREFIX + "predicted-host-hit-tokens"
HEADER_FAILED_OVER = HEADER_PREFIX + "failed-over"
"""Sent only when the request left a replica first: ``id: why`` per replica, ``; ``-separated."""
HEADER_PREFILL = HEADER_PREFIX + "prefill-replica"
"""Sent only when the prompt was prefilled on a prefill replica (the P/D split): its id."""
HEADER_PULLED_FROM = HEADER_PREFIX + "kv-pulled-from"
"""Sent only when the router asked the replica to pull the prefix from a peer: the peer's id."""
HEADER_PULLED_TOKENS = HEADER_PREFIX + "kv-pulled-tokens"
"""Prompt tokens whose KV the replica pulled from another replica (its own answer's header of that name)."""
HEADER_KV_NOT_SHARED = HEADER_PREFIX + "kv-not-shared"
"""Sent only when a replica holding more of the prompt (a pull) or a prefill replica (a split) could not hand its KV
to the chosen one: why (their KV layouts differ, or one advertises none usable: router/replicas/kv_share.py)."""
HEADER_PREDICTED_TTFT = HEADER_PREFIX + "predicted-ttft-s"
"""The predicted time to first token on the chosen replica, seconds (sent when priced)."""


def receipt_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """A client's view: the route receipt's headers among a response's ``headers``, their names lower-cased (empty
    unless the request asked for the receipt)."""
    return {k.lower(): v for k, v in headers.items() if k.lower().startswith(HEADER_PREFIX)}
HEADER_OPT_IN = HEADER_PREFIX + "receipt"
"""Request header a client sets (to any value) to get the receipt headers back."""


@dataclass(slots=True)
class RouteReceipt:
    """One routing decision, in the words a user debugging a miss needs."""

    replica_id: ReplicaId
    """The chosen replica."""
    reason: str
    """Why it was chosen: one of ``REASONS``."""
    predicted_hit_tokens: int
    """Prompt tokens the router expected the chosen replica to find cached."""
    best_hit_tokens: int
    """The largest hit (tokens) any candidate replica offered (>= ``predicted_hit_tokens``)."""
    best_replica_id: ReplicaId | None
    """A candidate offering ``best_hit_tokens`` (None when no candidate held any block)."""
    num_prompt_tokens: int
    """Prompt length in tokens."""
    session_id: str | None = None
    """The request's session id, if it had one."""
    predicted_host_tokens: int = 0
    """The part of ``predicted_hit_tokens`` expected from the replica's host tier (loaded back, not
    recomputed); the rest is on the device."""
    actual_cached_tokens: int | None = None
    """What the replica reported as cached (``usage.prompt_tokens_details.cached_tokens``); None until known."""
    actual_host_cached_tokens: int | None = None
    """The part of it the replica loaded back from its host tier (``host_cached_tokens``, written only by a
    kvmesh replica with a tier); None otherwise."""
    failed_over: tuple[str, ...] = ()
    """Replicas the request left before this one, each ``"id: why"`` (a failure or a missed deadline)."""
    prefill_replica_id: ReplicaId | None = None
    """The prefill replica that computed the prompt for this one (P/D split); None: no split."""
    pulled_from: ReplicaId | None = None
    """The peer the router asked the replica to pull the prefix from (peer pull); None: no pull asked."""
    kv_pulled_tokens: int | None = None
    """Prompt tokens the replica reported pulling (``x-kvmesh-kv-pulled-tokens``); None: it said nothing."""
    kv_not_shared: str | None = None
    """Why KV was not moved to the chosen replica from a replica holding more of the prompt or from a prefill
    replica (their KV layouts differ, or one advertises no usable layout); None: nothing was refused for that."""
    predicted_ttft_s: float | None = None
    """The router's predicted time to first token on the chosen replica (router/routing/cost/); None: unpriced."""
    predicted_pace_s: float | None = None
    """The predicted decode pace there, seconds per output token once it decodes (None: unpriced)."""
    actual_ttft_s: float | None = None
    """Seconds from routing to the replica's first output bytes of a streamed answer; None: not observed."""

    def __post_init__(self) -> None:
        if self.reason not in REASONS:
            raise ValueError(f"unknown route reason {self.reason!r}; expected one of {REASONS}")

    @property
    def diverted_tokens(self) -> int:
        """Hit tokens given up by not choosing the best-matching replica (load or session)."""
        return self.best_hit_tokens - self.predicted_hit_tokens

    @property
    def mispredicted(self) -> bool | None:
        """True when the replica reported another hit than predicted, its pulled tokens aside (they were not in
        its cache when routed); None before ``actual_cached_tokens``."""
        if self.actual_cached_tokens is None:
            return None
        return self.actual_cached_tokens - (self.kv_pulled_tokens or 0) != self.predicted_hit_tokens

    def headers(self) -> dict[str, str]:
        """Response headers carrying this receipt (sent when the request had ``x-kvmesh-receipt``)."""
        return {
            HEADER_REPLICA: str(self.replica_id),
            HEADER_REASON: self.reason,
            HEADER_PREDICTED: str(self.predicted_hit_tokens),
            HEADER_BEST: str(self.best_hit_tokens),
            HEADER_PROMPT: str(self.num_prompt_tokens),
            HEADER_PREDICTED_HOST: str(self.predicted_host_tokens),
        } | ({HEADER_PREDICTED_TTFT: f"{self.predicted_ttft_s:.6f}"} if self.predicted_ttft_s is not None else {}) \
            | ({HEADER_FAILED_OVER: "; ".join(self.failed_over)} if self.failed_over else {}) | self._transfer_headers()

    def _transfer_headers(self) -> dict[str, str]:
        out = {}
        if self.prefill_replica_id is not None:
            out[HEADER_PREFILL] = str(self.prefill_replica_id)
        if self.pulled_from is not None:
            out[HEADER_PULLED_FROM] = str(self.pulled_from)
        if self.kv_pulled_tokens is not None:
            out[HEADER_PULLED_TOKENS] = str(self.kv_pulled_tokens)
        if self.kv_not_shared is not None:  # a header value: printable ASCII only
            out[HEADER_KV_NOT_SHARED] = "".join(c if " " <= c <= "~" else "?" for c in self.kv_not_shared)
        return out

    def log_fields(self) -> dict:
        """Flat, JSON-ready fields for a structured access log line."""
        return {
            "replica": str(self.replica_id),
            "route_reason": self.reason,
            "prompt_tokens": self.num_prompt_tokens,
            "predicted_hit_tokens": self.predicted_hit_tokens,
            "predicted_host_hit_tokens": self.predicted_host_tokens,
            "best_hit_tokens": self.best_hit_tokens,
            "best_replica": None if self.best_replica_id is None else str(self.best_replica_id),
            "cached_tokens": self.actual_cached_tokens,
            "host_cached_tokens": self.actual_host_cached_tokens,
            "session_id": self.session_id,
            "failed_over": list(self.failed_over),
            "prefill_replica": None if self.prefill_replica_id is None else str(self.prefill_replica_id),
            "kv_pulled_from": None if self.pulled_from is None else str(self.pulled_from),
            "kv_pulled_tokens": self.kv_pulled_tokens,
            "kv_not_shared": self.kv_not_shared,
            "predicted_ttft_s": self.predicted_ttft_s,
            "predicted_pace_s": self.predicted_pace_s,
            "ttft_s": self.actual_ttft_s,
        }


class Receipts:
    """Aggregates completed receipts, cluster-wide and per replica (thread-safe)."""

    def __init__(self, replicas: ReplicaSet | None = None, block_size: int = 16) -> None:
        """``replicas``: the router's set, whose records hold each replica's totals (``Replica.reuse``; a replica
        removed takes its totals with it); None: a set of its own, where a replica is registered when first named."""
        self.total = ReuseTotals()
        """Over every completed receipt."""
        self._adds = replicas is None
        self.replicas = ReplicaSet() if replicas is None else replicas
        self._lock = threading.Lock()
        self.ceiling = LiveCeiling(block_size, lambda: fleet_kv_blocks(self.replicas))
        """The single-pool ceiling of the requests completed with their keys, and their misses by kind."""

    def record_actual(self, receipt: RouteReceipt, cached_tokens: int, host_cached_tokens: int | None = None,
                      keys: Sequence[int] | None = None, output_tokens: int = 0) -> RouteReceipt:
        """Complete ``receipt`` with the replica's reported ``cached_tokens`` (and the part of them from its
        host tier, when it has one) and count it; with the prompt's ``keys`` (and the answer's ``output_tokens``)
        the live ceiling replays it too (``ceiling``)."""
        if cached_tokens < 0:
            raise ValueError(f"cached_tokens must be >= 0, got {cached_tokens}")
        receipt.actual_cached_tokens = cached_tokens
        receipt.actual_host_cached_tokens = host_cached_tokens
        with self._lock:
            self.total.add(receipt, cached_tokens)
            replica = self.replicas.get(receipt.replica_id)
            if replica is None and self._adds:
                replica = self.replicas.add(Replica(receipt.replica_id, healthy=True, state=READY))
            if replica is not None:
                replica.reuse.add(receipt, cached_tokens)
        if keys is not None:
            self.ceiling.observe(keys, receipt.num_prompt_tokens, output_tokens, cached_tokens,
                                 receipt.predicted_hit_tokens, receipt.best_hit_tokens)
        return receipt

    def summary(self) -> dict:
        """JSON-ready totals: ``{"cluster": {...}, "replicas": {id: {...}}}``."""
        with self._lock:
            return {"cluster": self.total.as_dict(),
                    "replicas": {r.id: r.reuse.as_dict() for r in self.replicas if r.reuse.requests}}


def fleet_kv_blocks(replicas: ReplicaSet) -> int:
    """The usable KV blocks of the fleet, as its replicas last reported them (each less its null block)."""
    return sum(max(0, r.load.num_kv_blocks - 1) for r in replicas)


def route_receipt(replica: Replica, tiers: TierMatches, loads: Mapping, num_tokens: int, session_id: str | None,
                  why: str | None, estimate, block_size: int) -> RouteReceipt:
    """A decision in a user's words: its hit against the best candidate's (a host-tier block past the device prefix
    is a hit too, loaded back), why it was chosen (``why``, else by cache or by load), its predicted TTFT when the
    policy prices in seconds (``estimate``)."""
    either, replica_id = tiers.either(), replica.id
    matched = either.get(replica_id, 0)
    best_id, best = None, 0
    for rid, m in either.items():
        if m > best and rid in loads:
            best_id, best = rid, m
    hit, best_hit = reusable_tokens(matched, num_tokens, block_size), reusable_tokens(best, num_tokens, block_size)
    host_hit = hit - reusable_tokens(tiers.device.get(replica_id, 0), num_tokens, block_size)
    reason = why or ("cache" if matched and matched == best else "load")
    predicted = estimate.ttft_s if estimate is not None and estimate.priced else None
    return RouteReceipt(replica_id, reason, hit, best_hit, best_id, num_tokens, session_id, host_hit,
                        predicted_ttft_s=predicted, predicted_pace_s=estimate.pace_s if predicted is not None else None)
