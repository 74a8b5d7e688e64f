"""Talking to a running router over HTTP: the replica registry and a per-replica status table.

The router (router/server.py) exposes ``GET/POST /replicas``, ``DELETE /replicas/{id}``,
``POST /replicas/{id}/drain``, the serve process's ``/admin/{fleet,scale,rollout}``, ``/health``
and Prometheus ``/metrics``. serve's supervisor registers replicas through this
client (the same calls work for a router in another process or on another node); ``kvmesh
status`` builds its table from ``/replicas`` + ``/metrics``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx


@dataclass(slots=True)
class ReplicaStatus:
    """One row of ``kvmesh status``."""

    replica_id: str
    url: str = ""
    healthy: bool = False
    draining: bool = False
    """Out of rotation: its running requests finish, then it is removed (``kvmesh drain``, the autoscaler)."""
    kv_usage: float = 0.0
    """Fraction of the replica's KV blocks held by running requests (its /load)."""
    index_blocks: int = 0
    """Blocks the router's index holds for this replica (from its events)."""
    in_flight: int = 0
    num_running: int = 0
    num_waiting: int = 0
    requests_routed: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    """Prompt tokens the replica reported as served from cache."""
    predicted_hit_tokens: int = 0
    event_lag_s: float | None = None
    """Publish-to-apply delay of the last event batch (None: no batch yet)."""
    event_gaps: int = 0
    event_restarts: int = 0

    @property
    def hit_rate(self) -> float | None:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None


class RouterClient:
    """Synchronous client of one router's admin and status endpoints."""

    def __init__(self, url: str, api_key: str | None = None, timeout_s: float = 5.0,
                 admin_key: str | None = None) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(timeout=timeout_s, headers=headers, trust_env=False)
        self._admin = {"Authorization": f"Bearer {admin_key}"} if admin_key else {}
        """Sent instead of the API key on requests that change the replica set (the router's admin plane)."""

    def close(self) -> None:
        self._http.close()

    def health(self) -> dict[str, Any]:
        return self._http.get(self.url + "/health").json()

    def replicas(self, drain_cost: bool = False) -> list[dict[str, Any]]:
        """``GET /replicas`` rows; ``drain_cost`` adds ``exclusive_blocks`` (a walk over the router's index)."""
        response = self._http.get(self.url + "/replicas", params={"drain_cost": "true"} if drain_cost else None)
        response.raise_for_status()
        return response.json()["replicas"]

    def register(self, replica_id: str, url: str, events: str | None, replay: str | None) -> dict[str, Any]:
        """Add a replica, or re-register it with new endpoints (the router drops its old tree)."""
        body = {"id": replica_id, "url": url, "events": events, "replay": replay}
        response = self._http.post(self.url + "/replicas", json=body, headers=self._admin)
        response.raise_for_status()
        return response.json()

    def deregister(self, replica_id: str) -> bool:
        response = self._http.delete(f"{self.url}/replicas/{replica_id}", headers=self._admin)
        return response.status_code == 200

    def drain(self, replica_id: str) -> dict[str, Any]:
        """Stop routing new requests to a replica (its running ones finish); raises on 403/404."""
        response = self._http.post(f"{self.url}/replicas/{replica_id}/drain", headers=self._admin)
        response.raise_for_status()
        return response.json()

    def fleet(self) -> dict[str, Any]:
        """The serve process's replica set, target and scaling decisions (``GET /admin/fleet``)."""
        response = self._http.get(self.url + "/admin/fleet", headers=self._admin)
        response.raise_for_status()
        return response.json()

    def scale(self, replicas: int) -> dict[str, Any]:
        response = self._http.post(self.url + "/admin/scale", json={"replicas": replicas}, headers=self._admin)
        response.raise_for_status()
        return response.json()

    def rollout(self, engine: dict[str, Any] | None = None) -> dict[str, Any]:
        response = self._http.post(self.url + "/admin/rollout", json={"engine": engine or {}}, headers=self._admin)
        response.raise_for_status()
        return response.json()

    def metrics_text(self) -> str:
        response = self._http.get(self.url + "/metrics")
        response.raise_for_status()
        return response.text

    def status(self) -> list[ReplicaStatus]:
        """Per-replica rows from /replicas (who, where, health) and /metrics (the numbers)."""
        rows = {r["id"]: ReplicaStatus(replica_id=r["id"], url=r["url"], healthy=r["healthy"],
                                       draining=bool(r.get("draining")))
                for r in self.replicas()}
        apply_metrics(rows, self.metrics_text())
        return sorted(rows.values(), key=lambda r: r.replica_id)


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
}


def apply_metrics(rows: dict[str, ReplicaStatus], text: str) -> None:
    """Fill ``rows`` from the router's Prometheus text (unknown replicas get rows of their own)."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            replica = sample.labels.get("replica")
            if replica is None:
                continue
            row = rows.setdefault(replica, ReplicaStatus(replica_id=replica))
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
