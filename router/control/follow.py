"""A router worker inside ``kvmesh serve`` follows serve's control router (cluster/serve_router.py).

The control router, in the serve process, is the one owner of the replica set: serve's supervisor
and fleet register, drain and remove replicas there. Each worker

- reads the control router's ``GET /replicas`` every ``FOLLOW_INTERVAL_S`` and makes its own set
  equal (add / re-register, drain, remove) -- a worker restarted after a crash catches up the same
  way; and writes how many replicas it routes to in the shared table (serve waits on it);
- passes every admin-plane request it receives (``is_admin_request``: ``POST /replicas``,
  ``DELETE``, ``/drain``, ``/admin/*``) through to the control router unchanged, credentials
  included, and answers with its answer. The change then reaches every worker by the first rule.
"""

from __future__ import annotations

import asyncio
import json
import logging

import aiohttp
from kvmesh.replica.serving.errors import error_body
from kvmesh.router.config import ReplicaSpec
from kvmesh.router.control.admin_routes import is_admin_request

logger = logging.getLogger(__name__)

FOLLOW_INTERVAL_S = 0.25
"""Seconds between two reads of the control router's replica set."""
MAX_ADMIN_BODY = 1 << 20
"""Largest admin request body passed through (bytes)."""
_PASSED_HEADERS = (b"authorization", b"content-type")


class ControlFollower:
    """One worker's link to the control router: ``wrap(app)`` is the ASGI app the worker serves."""

    def __init__(self, runtime, control_url: str, table, row: int) -> None:
        self.runtime = runtime
        self.control_url = control_url.rstrip("/")
        self.table, self.row = table, row
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task | None = None
        self._failing = False

    def wrap(self, app):
        async def followed(scope, receive, send):
            if scope["type"] == "lifespan":
                return await self._lifespan(app, scope, receive, send)
            if scope["type"] == "http" and is_admin_request(scope["method"], scope["path"]):
                return await self._pass_through(scope, receive, send)
            return await app(scope, receive, send)

        return followed

    # ---------------------------------------------------------------- lifecycle
    async def _lifespan(self, app, scope, receive, send) -> None:
        async def started(message):
            if message["type"] == "lifespan.startup.complete":
                self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
                await self.follow_once()  # serve the replica set from the first request on
                self._task = asyncio.create_task(self._follow())
            await send(message)

        try:
            await app(scope, receive, started)
        finally:
            if self._task is not None:
                self._task.cancel()
                await asyncio.gather(self._task, return_exceptions=True)
            if self._session is not None:
                await self._session.close()

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(FOLLOW_INTERVAL_S)
            await self.follow_once()

    # ---------------------------------------------------------------- following
    async def follow_once(self) -> None:
        """Read the control router's replica set and make this worker's equal to it."""
        key = self.runtime.config.api_key
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        try:
            async with self._session.get(self.control_url + "/replicas", headers=headers) as r:
                r.raise_for_status()
                rows = (await r.json())["replicas"]
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError) as e:
            if not self._failing:
                logger.warning("router worker %d cannot read the control router's replicas (%s); "
                               "keeping its set", self.row, e)
            self._failing = True
            return
        self._failing = False
        self.apply(rows)

    def apply(self, rows: list[dict]) -> None:
        runtime = self.runtime
        wanted = {row["id"]: row for row in rows}
        for replica_id in list(runtime.specs):
            if replica_id not in wanted:
                runtime.remove_replica(replica_id)
        for replica_id, row in wanted.items():
            spec = ReplicaSpec(url=row["url"], events=row.get("events"), replay=row.get("replay"),
                               replica_id=replica_id)
            if replica_id in runtime.draining and not row.get("draining"):
                runtime.remove_replica(replica_id)  # re-registered at the control router: start afresh
            runtime.add_replica(spec)
            if row.get("draining"):
                runtime.drain(replica_id)
        self.table.healthy_seen[self.row] = len(runtime.router.healthy)

    # ---------------------------------------------------------------- admin plane
    async def _pass_through(self, scope, receive, send) -> None:
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > MAX_ADMIN_BODY:
                return await _answer(send, 413, _error(f"admin request body over {MAX_ADMIN_BODY} bytes", 413))
        headers = {k.decode(): v.decode("latin-1") for k, v in scope["headers"] if k in _PASSED_HEADERS}
        url = self.control_url + scope["path"] + (f"?{scope['query_string'].decode()}" if scope["query_string"] else "")
        try:
            async with self._session.request(scope["method"], url, data=body, headers=headers) as r:
                answer = await r.read()
                await _answer(send, r.status, answer, r.headers.get("content-type", "application/json"))
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            await _answer(send, 503, _error(f"serve's control router did not answer ({type(e).__name__}); "
                                            "retry", 503))


def _error(message: str, code: int) -> bytes:
    return json.dumps(error_body(message, code)).encode()


async def _answer(send, status: int, body: bytes, content_type: str = "application/json") -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
