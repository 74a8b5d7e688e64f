"""Talking to a running router over HTTP: the replica registry and a per-replica status table.

The router (router/control/router_server.py) exposes ``GET/POST /replicas``, ``DELETE /replicas/{id}``,
``POST /replicas/{id}/drain``, the serve process's ``/admin/{fleet,scale,rollout}``, ``/health``
and Prometheus ``/metrics``. serve's supervisor registers replicas through this
client (the same calls work for a router in another process or on another node); ``kvmesh
status`` builds its table from ``/replicas`` + ``/metrics``, and the hit rate from each replica's own
``/metrics`` (its prefix-cache counters count every prompt, streams without usage included). It is synchronous for its callers
(the launcher, the supervisor thread, the CLI): the aiohttp session runs on a private event-loop
thread, so any thread may call it, one request at a time per call.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import TypeVar

import aiohttp
import msgspec
from kvmesh.router.control.rows import ReplicaList, ReplicaRow
from kvmesh.router.routing.load import ReplicaLoad

T = TypeVar("T")
Json = dict[str, object]
"""A JSON object the router answered (health, fleet state, a registration's answer), passed on as it is."""


@dataclass(slots=True)
class ReplicaStatus(ReplicaLoad):
    """One row of ``kvmesh status``: the router's load view of a replica (``ReplicaLoad``: in flight,
    running, waiting, KV usage) and what its metrics count."""

    replica_id: str
    url: str = ""
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


class RouterClient:
    """Synchronous client of one router's admin and status endpoints.

    Raises ``aiohttp.ClientResponseError`` (with ``.status``) for an error answer and
    ``aiohttp.ClientError`` / ``TimeoutError`` when the router cannot be reached.
    """

    def __init__(self, url: str, api_key: str | None = None, timeout_s: float = 5.0,
                 admin_key: str | None = None) -> None:
        self.url = url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._admin = {"Authorization": f"Bearer {admin_key}"} if admin_key else {}
        """Sent instead of the API key on requests that change the replica set (the router's admin plane)."""
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="router-client", daemon=True)
        self._thread.start()
        self._session: aiohttp.ClientSession | None = None

    def close(self) -> None:
        if self._loop.is_closed():
            return
        if self._session is not None:
            self._run(self._session.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def _run(self, coro: Coroutine[object, object, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _fetch(self, method: str, path: str, body: Json | None = None, admin: bool = False,
                     check: bool = True) -> tuple[int, bytes]:
        if self._session is None:  # made on the loop's own thread, as aiohttp wants
            self._session = aiohttp.ClientSession(timeout=self._timeout, headers=self._headers)
        async with self._session.request(method, self.url + path, json=body,
                                         headers=self._admin if admin else None) as response:
            raw = await response.read()
            if check and response.status >= 400:  # the router's own error message, not just the reason phrase
                raise aiohttp.ClientResponseError(response.request_info, response.history, status=response.status,
                                                  message=_error_message(raw) or response.reason or "",
                                                  headers=response.headers)
            return response.status, raw

    def _request(self, method: str, path: str, body: Json | None = None, admin: bool = False,
                 check: bool = True) -> tuple[int, bytes]:
        return self._run(self._fetch(method, path, body, admin, check))

    def health(self) -> Json:
        return json.loads(self._request("GET", "/health", check=False)[1])

    def replica_rows(self, drain_cost: bool = False) -> list[ReplicaRow]:
        """``GET /replicas``; ``drain_cost`` adds ``exclusive_blocks`` (a walk over the router's index)."""
        path = "/replicas?drain_cost=true" if drain_cost else "/replicas"
        return ReplicaList.decode(self._request("GET", path)[1]).replicas

    def replicas(self, drain_cost: bool = False) -> list[Json]:
        """``replica_rows`` as JSON objects, for the autoscaling policy (cluster/fleet/autoscaler.py), which the
        simulator feeds with rows of its own."""
        return [msgspec.to_builtins(row) for row in self.replica_rows(drain_cost)]

    def register(self, replica_id: str, url: str, events: str | None, replay: str | None) -> Json:
        """Add a replica, or re-register it with new endpoints (the router drops its old tree)."""
        body = {"id": replica_id, "url": url, "events": events, "replay": replay}
        return json.loads(self._request("POST", "/replicas", body, admin=True)[1])

    def deregister(self, replica_id: str) -> bool:
        return self._request("DELETE", f"/replicas/{replica_id}", admin=True, check=False)[0] == 200

    def drain(self, replica_id: str) -> Json:
        """Stop routing new requests to a replica (its running ones finish); raises on 403/404."""
        return json.loads(self._request("POST", f"/replicas/{replica_id}/drain", admin=True)[1])

    def fleet(self) -> Json:
        """The serve process's replica set, target and scaling decisions (``GET /admin/fleet``)."""
        return json.loads(self._request("GET", "/admin/fleet", admin=True)[1])

    def scale(self, replicas: int) -> Json:
        return json.loads(self._request("POST", "/admin/scale", {"replicas": replicas}, admin=True)[1])

    def rollout(self, engine: Json | None = None) -> Json:
        return json.loads(self._request("POST", "/admin/rollout", {"engine": engine or {}}, admin=True)[1])

    def metrics_text(self) -> str:
        return self._request("GET", "/metrics")[1].decode()

    def status(self) -> list[ReplicaStatus]:
        """Per-replica rows from /replicas (who, where, health), the router's /metrics (the numbers) and each
        replica's /metrics (its prefix-cache counters; a replica that does not answer keeps the router's)."""
        rows = {r.id: ReplicaStatus(replica_id=r.id, url=r.url, healthy=r.healthy, degraded=r.degraded,
                                    draining=r.draining, ejected=r.ejected, ejected_for_s=r.ejected_for_s,
                                    last_failure=r.last_failure)
                for r in self.replica_rows()}
        apply_metrics(rows, self.metrics_text())
        for row, text in zip(rows.values(), self._run(self._replica_metrics(list(rows.values()))), strict=True):
            if text is not None:
                apply_cache_counters(row, text)
        return sorted(rows.values(), key=lambda r: r.replica_id)

    async def _replica_metrics(self, rows: list[ReplicaStatus]) -> list[str | None]:
        """Each replica's /metrics text (public: no key is sent to it), None where it does not answer."""
        async def scrape(session: aiohttp.ClientSession, url: str) -> str | None:
            try:
                async with session.get(url.rstrip("/") + "/metrics") as response:
                    return (await response.text()) if response.status == 200 else None
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
                return None

        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=REPLICA_SCRAPE_TIMEOUT_S)) as session:
            return list(await asyncio.gather(*(scrape(session, row.url) for row in rows)))


REPLICA_SCRAPE_TIMEOUT_S = 2.0
"""How long ``kvmesh status`` waits for a replica's /metrics (a slow one keeps the router's numbers)."""

# replica metric (sample name, vLLM's) -> ReplicaStatus field
_CACHE_COUNTERS = {"vllm:prefix_cache_queries_total": "prefix_cache_queries",
                   "vllm:prefix_cache_hits_total": "prefix_cache_hits"}

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


def _error_message(raw: bytes) -> str | None:
    """The message of an OpenAI-shaped error body, if that is what ``raw`` is."""
    try:
        return str(json.loads(raw)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return None
