"""One row per replica of ``kvmesh status``: the router's view (``/replicas``, its ``/metrics``) and the replica's
own counters (its ``/metrics``: prefix cache, KV transfer), each read from Prometheus text.

    router /replicas ──▶ id, url, role, health, draining, ejection
    router /metrics  ──▶ load, index blocks, routed, usage-reported tokens, event lag, gaps   (apply_metrics)
    replica /metrics ──▶ prefix-cache queries/hits (vLLM's names), KV pulls, tokens and bytes moved, leases
                                                                                           (apply_replica_metrics)
"""

from __future__ import annotations

from dataclasses import dataclass

from kvmesh.router.replicas.load import ReplicaLoad


@dataclass(slots=True)
class ReplicaStatus(ReplicaLoad):
    """One row of ``kvmesh status``: the router's load view of a replica (``ReplicaLoad``: in flight,
    running, waiting, KV usage) and what its metrics count."""

    replica_id: str
    url: str = ""
    role: str | None = None
    """prefill, decode or both, as the router's /replicas says (None: a router that does not say)."""
    healthy: bool = False
    draining: bool = False
    """Out of rotation: its running requests finish, then it is removed (``kvmesh drain``, the autoscaler)."""
    index_blocks: int = 0
    """Blocks the router's index holds for this replica (from its events)."""
    requests_routed: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    """Prompt tokens the replica reported as served from cache."""
    predicted_hit_tokens: int = 0
    predicted_host_tokens: int = 0
    """The part of ``predicted_hit_tokens`` routed to the replica's host tier (loaded back there)."""
    host_cached_tokens: int = 0
    """The part of ``cached_tokens`` the replica reported loading back from its host tier."""
    event_lag_s: float | None = None
    """Publish-to-apply delay of the last event batch (None: no batch yet)."""
    event_gaps: int = 0
    event_restarts: int = 0
    degraded: str | None = None
    """Why the router does not trust this replica's event stream (routes it by load only); None: trusted."""
    event_bad_frames: int = 0
    """Event messages from this replica the router dropped as bad (undecodable, over a limit)."""
    ejected: bool = False
    """Out of rotation after failures in a row (outlier detection) until a probe request is answered."""
    ejected_for_s: float = 0.0
    """Seconds left of that ejection."""
    last_failure: str | None = None
    """What its last failed answer was."""
    prefix_cache_queries: int | None = None
    """Prompt tokens the replica looked up in its prefix cache (its ``vllm:prefix_cache_queries``); None: its
    /metrics did not answer."""
    prefix_cache_hits: int = 0
    """Of those, tokens found cached (``vllm:prefix_cache_hits``)."""
    kv_pulls: int | None = None
    """KV pulls from a peer that succeeded (its ``kvmesh:kv_transfer_pulls_total{outcome="ok"}``); None: the replica
    has no KV transfer counters (transfer off, or its /metrics did not answer)."""
    kv_pulls_failed: int = 0
    """Pulls that failed (the replica computed the prompt itself)."""
    kv_pulled_tokens: int = 0
    """Prompt tokens it got by pulls instead of computing them."""
    kv_pulled_bytes: int = 0
    """Bytes of KV it pulled."""
    kv_leases: int = 0
    """Leases it gave (blocks held for a peer to pull: a prefill replica's hand-overs)."""

    @property
    def hit_rate(self) -> float | None:
        """The replica's own count when it answered (every request, streams without usage too), else what the
        router saw in usage (only requests whose client asked for it)."""
        if self.prefix_cache_queries is not None:
            return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else None
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None

    @property
    def host_hit_rate(self) -> float | None:
        """Prompt tokens the replica reported loading back from its host tier / prompt tokens (None: no tier
        or no prompts)."""
        if not self.num_host_kv_blocks or not self.prompt_tokens:
            return None
        return self.host_cached_tokens / self.prompt_tokens


REPLICA_SCRAPE_TIMEOUT_S = 2.0
"""How long ``kvmesh status`` waits for a replica's /metrics (a slow one keeps the router's numbers)."""

# replica metric (sample name, vLLM's) -> ReplicaStatus field
_CACHE_COUNTERS = {"vllm:prefix_cache_queries_total": "prefix_cache_queries",
                   "vllm:prefix_cache_hits_total": "prefix_cache_hits"}

# replica metric (sample name; the pulls by outcome) -> ReplicaStatus field (replica/server/kv_metrics.py)
_KV_PULLS = "kvmesh_kv_transfer_pulls_total"
_KV_COUNTERS = {f"{_KV_PULLS}/ok": "kv_pulls", f"{_KV_PULLS}/failed": "kv_pulls_failed",
                "kvmesh_kv_transfer_pulled_tokens_total": "kv_pulled_tokens",
                "kvmesh_kv_transfer_pulled_bytes_total": "kv_pulled_bytes",
                "kvmesh_kv_transfer_leases_total": "kv_leases"}

# router metric (sample name) -> ReplicaStatus field; counters come as <name>_total
_GAUGES = {
    "kvmesh_router_replica_kv_usage": "kv_usage",
    "kvmesh_router_index_blocks": "index_blocks",
    "kvmesh_router_replica_in_flight": "in_flight",
    "kvmesh_router_replica_num_running": "num_running",
    "kvmesh_router_replica_num_waiting": "num_waiting",
    "kvmesh_router_event_lag_last_seconds": "event_lag_s",
    "kvmesh_router_prompt_tokens_total": "prompt_tokens",
    "kvmesh_router_reported_cached_tokens_total": "cached_tokens",
    "kvmesh_router_predicted_hit_tokens_total": "predicted_hit_tokens",
    "kvmesh_router_predicted_host_hit_tokens_total": "predicted_host_tokens",
    "kvmesh_router_reported_host_cached_tokens_total": "host_cached_tokens",
    "kvmesh_router_replica_host_kv_usage": "host_kv_usage",
    "kvmesh_router_replica_num_host_kv_blocks": "num_host_kv_blocks",
}


def apply_metrics(rows: dict[str, ReplicaStatus], text: str) -> None:
    """Fill ``rows`` from the router's Prometheus text. Replicas without a row are left out: the
    router's counters outlive removed replicas, and a status must not show ghosts."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            replica = sample.labels.get("replica")
            if replica is None:
                continue
            row = rows.get(replica)
            if row is None:
                continue
            name = sample.name
            if name in _GAUGES:
                current = getattr(row, _GAUGES[name])
                kind = type(current) if current is not None else float
                setattr(row, _GAUGES[name], kind(sample.value))
            elif name == "kvmesh_router_decisions_total":
                row.requests_routed += int(sample.value)
            elif name == "kvmesh_router_event_stream_total":
                counter = sample.labels.get("counter")
                if counter == "gaps":
                    row.event_gaps = int(sample.value)
                elif counter == "restarts":
                    row.event_restarts = int(sample.value)
                elif counter == "bad_frames":
                    row.event_bad_frames = int(sample.value)


def apply_replica_metrics(row: ReplicaStatus, text: str) -> None:
    """Fill ``row`` from the replica's own Prometheus text: prefix-cache and KV transfer counters."""
    apply_cache_counters(row, text)
    apply_kv_transfer_counters(row, text)


def apply_kv_transfer_counters(row: ReplicaStatus, text: str) -> None:
    """Fill ``row``'s pulls, tokens and bytes moved and leases from the replica's ``kvmesh_kv_transfer_*`` counters
    (a replica without them, e.g. a vLLM server, leaves ``kv_pulls`` None: status shows "-")."""
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[str, int] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                key = sample.name
                if key == _KV_PULLS:
                    key += "/" + sample.labels.get("outcome", "")
                if key in _KV_COUNTERS:
                    found[_KV_COUNTERS[key]] = found.get(_KV_COUNTERS[key], 0) + int(sample.value)
    except ValueError:  # not Prometheus text
        return
    if not found:
        return
    row.kv_pulls = found.get("kv_pulls", 0)
    for name, value in found.items():
        setattr(row, name, value)


def apply_cache_counters(row: ReplicaStatus, text: str) -> None:
    """Fill ``row``'s prefix-cache counters from the replica's Prometheus text (a replica that has none, e.g.
    a server of another kind, leaves them unknown)."""
    from prometheus_client.parser import text_string_to_metric_families

    found = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in _CACHE_COUNTERS:
                    found[_CACHE_COUNTERS[sample.name]] = found.get(_CACHE_COUNTERS[sample.name], 0) + int(sample.value)
    except ValueError:  # not Prometheus text
        return
    if "prefix_cache_queries" in found:
        row.prefix_cache_queries = found["prefix_cache_queries"]
        row.prefix_cache_hits = found.get("prefix_cache_hits", 0)
