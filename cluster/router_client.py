"""Talking to a running router over HTTP: the replica registry and a per-replica status table.

The router (router/control/router_server.py) exposes, to the admin key, ``GET/POST /replicas``, ``DELETE
/replicas/{id}``,
``POST /replicas/{id}/drain``, the serve process's ``/admin/{fleet,scale,rollout}``, ``/health``
and Prometheus ``/metrics``. serve's supervisor registers replicas through this
client (the same calls work for a router in another process or on another node); ``kvmesh
status`` builds its rows (cluster/replica_status.py) from ``/replicas`` + ``/metrics``, and the hit rate and KV
transfers from each replica's own ``/metrics`` (its prefix-cache counters count every prompt, streams without
usage included). It is synchronous for its callers
(the launcher, the supervisor thread, the CLI): the aiohttp session runs on a private event-loop
thread, so any thread may call it, one request at a time per call.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Coroutine
from typing import TypeVar

import aiohttp
import msgspec
from kvmesh.cluster.replica_status import (
    REPLICA_SCRAPE_TIMEOUT_S,
    ReplicaStatus,
    apply_metrics,
    apply_replica_metrics,
)
from kvmesh.router.control.rows import ReplicaList, ReplicaRow

T = TypeVar("T")
Json = dict[str, object]
"""A JSON object the router answered (health, fleet state, a registration's answer), passed on as it is."""


class RouterClient:
    """Synchronous client of one router's admin and status endpoints.

    Raises ``aiohttp.ClientResponseError`` (with ``.status``) for an error answer,
    ``aiohttp.ClientError`` when the router cannot be reached and ``TimeoutError`` (naming the call) when it does
    not answer within ``timeout_s``.
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
        try:
            return self._run(self._fetch(method, path, body, admin, check))
        except TimeoutError:  # aiohttp's total timeout carries no message: say which call went unanswered
            raise TimeoutError(f"the router at {self.url} did not answer {method} {path.split('?')[0]} within "
                               f"{self._timeout.total:g}s") from None

    def health(self) -> Json:
        return json.loads(self._request("GET", "/health", check=False)[1])

    def replica_list(self, drain_cost: bool = False) -> ReplicaList:
        """``GET /replicas`` (the admin key: it names the replicas' URLs): the rows and the requests admission holds;
        ``drain_cost`` adds ``exclusive_blocks`` (a walk over the router's index)."""
        path = "/replicas?drain_cost=true" if drain_cost else "/replicas"
        return ReplicaList.decode(self._request("GET", path, admin=True)[1])

    def replica_rows(self, drain_cost: bool = False) -> list[ReplicaRow]:
        """``replica_list``'s rows."""
        return self.replica_list(drain_cost).replicas

    def replicas(self, drain_cost: bool = False) -> list[Json]:
        """``replica_rows`` as JSON objects, for the autoscaling policy (cluster/fleet/autoscaler.py), which the
        simulator feeds with rows of its own."""
        return [msgspec.to_builtins(row) for row in self.replica_rows(drain_cost)]

    def _replica_json(self) -> list[Json]:
        """``GET /replicas`` rows as JSON, for ``status``: a router of another version may add fields (``role``)
        or lack them, which status then shows as unknown."""
        return json.loads(self._request("GET", "/replicas", admin=True)[1])["replicas"]

    def register(self, replica_id: str, url: str, events: str | None, replay: str | None, role: str = "both") -> Json:
        """Add a replica, or re-register it with new endpoints (the router drops its old tree); ``role``: prefill,
        decode or both (sent only when not both, the router's default)."""
        body = {"id": replica_id, "url": url, "events": events, "replay": replay}
        if role != "both":
            body["role"] = role
        return json.loads(self._request("POST", "/replicas", body, admin=True)[1])

    def deregister(self, replica_id: str) -> bool:
        return self._request("DELETE", f"/replicas/{replica_id}", admin=True, check=False)[0] == 200

    def drain(self, replica_id: str) -> Json:
        """Stop routing new requests to a replica (its running ones finish); raises on 403/404."""
        return json.loads(self._request("POST", f"/replicas/{replica_id}/drain", admin=True)[1])

    def fleet(self) -> Json:
        """The serve process's replica set, target and scaling decisions (``GET /admin/fleet``)."""
        return json.loads(self._request("GET", "/admin/fleet", admin=True)[1])

    def scale(self, replicas: int, role: str | None = None, deployment: str | None = None) -> Json:
        """``POST /admin/scale``: ``role`` prefill, or None/decode/both for the replicas that serve requests;
        ``deployment``: that deployment's replicas (a cluster of several models)."""
        body: Json = {"replicas": replicas} if role is None else {"replicas": replicas, "role": role}
        if deployment is not None:
            body["deployment"] = deployment
        return json.loads(self._request("POST", "/admin/scale", body, admin=True)[1])

    def rollout(self, engine: Json | None = None, deployment: str | None = None) -> Json:
        body: Json = {"engine": engine or {}} | ({"deployment": deployment} if deployment is not None else {})
        return json.loads(self._request("POST", "/admin/rollout", body, admin=True)[1])

    def load_lora_adapter(self, name: str, path: str, base_model_name: str | None = None) -> Json:
        """``POST /v1/load_lora_adapter`` (admin key): the router loads adapter ``name`` from ``path`` on the replicas
        of its base model (``base_model_name``: a deployment's served name; None: the router's only one)."""
        body: Json = {"lora_name": name, "lora_path": path}
        if base_model_name is not None:
            body["base_model_name"] = base_model_name
        return json.loads(self._request("POST", "/v1/load_lora_adapter", body, admin=True)[1])

    def unload_lora_adapter(self, name: str) -> Json:
        """``POST /v1/unload_lora_adapter`` (admin key): unloaded from every replica that has it."""
        return json.loads(self._request("POST", "/v1/unload_lora_adapter", {"lora_name": name}, admin=True)[1])

    def metrics_text(self) -> str:
        return self._request("GET", "/metrics")[1].decode()

    def status(self) -> list[ReplicaStatus]:
        """Per-replica rows from /replicas (who, where, health), the router's /metrics (the numbers) and each
        replica's /metrics (its prefix-cache counters; a replica that does not answer keeps the router's)."""
        rows = {r["id"]: ReplicaStatus(replica_id=r["id"], url=r["url"], role=r.get("role"), healthy=r["healthy"],
                                       degraded=r["degraded"], draining=r["draining"], ejected=r.get("ejected", False),
                                       ejected_for_s=r.get("ejected_for_s", 0.0), last_failure=r.get("last_failure"))
                for r in self._replica_json()}
        apply_metrics(rows, self.metrics_text())
        for row, text in zip(rows.values(), self._run(self._replica_metrics(list(rows.values()))), strict=True):
            if text is not None:
                apply_replica_metrics(row, text)
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


def _error_message(raw: bytes) -> str | None:
    """The message of an OpenAI-shaped error body, if that is what ``raw`` is."""
    try:
        return str(json.loads(raw)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return None
