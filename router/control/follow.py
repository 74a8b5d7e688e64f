"""A router worker inside ``kvmesh serve`` follows serve's control router (cluster/launch/serve_router.py).

The control router, in the serve process, is the one owner of the replica set: serve's supervisor
and fleet register, drain and remove replicas there. Each worker

- reads the control router's ``GET /replicas`` every ``FOLLOW_INTERVAL_S`` and makes its own set
  equal (add / re-register, drain, remove) -- a worker restarted after a crash catches up the same
  way; and writes how many replicas it routes to in the shared table (serve waits on it);
- passes every request that changes the replica set, or is for the fleet (``answered_by_owner``:
  ``POST /replicas``, ``DELETE``, ``/drain``, ``/admin/*``) through to the control router unchanged, credentials
  included, and answers with its answer (a rule of the worker's door, router/http/door.py). The
  change then reaches every worker by the first rule.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from kvmesh.replica.serving.errors import ProtocolError
from kvmesh.router.config import ReplicaSpec
from kvmesh.router.control.admin_routes import answered_by_owner
from kvmesh.router.control.rows import ReplicaList, ReplicaRow
from kvmesh.router.http.messages import HttpRequest, Response
from kvmesh.router.http.upstream import UpstreamError, UpstreamPool

if TYPE_CHECKING:
    from kvmesh.router.control.router_server import RouterServer
    from kvmesh.router.control.runtime import RouterRuntime
    from kvmesh.router.routing.shared_loads import SharedLoadTable

logger = logging.getLogger(__name__)

FOLLOW_INTERVAL_S = 0.25
"""Seconds between two reads of the control router's replica set."""
MAX_ADMIN_BODY = 1 << 20
"""Largest admin request body passed through (bytes)."""
CONTROL_TIMEOUT_S = 10.0
"""Seconds the control router has to answer one read or one passed-through request."""
_PASSED_HEADERS = (b"authorization", b"content-type")


class ControlFollower:
    """One worker's link to the control router: ``join(server)`` makes the worker follow it."""

    def __init__(self, server: RouterServer, control_url: str, table: SharedLoadTable, row: int) -> None:
        self.runtime = server.runtime
        self.control_url = control_url.rstrip("/")
        self.table, self.row = table, row
        self._pool: UpstreamPool | None = None
        self._task: asyncio.Task | None = None
        self._failing = False

    @classmethod
    def join(cls, server: RouterServer, control_url: str, table: SharedLoadTable, row: int) -> ControlFollower:
        """Follow from ``server``'s start to its stop; its door passes the admin plane on."""
        follower = cls(server, control_url, table, row)
        server.companions.append(follower)
        server.door.add_rule(answered_by_owner, follower.pass_through)
        return follower

    # ---------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        """Serve the control router's replica set from the first request on, then keep following it."""
        self._pool = UpstreamPool(CONTROL_TIMEOUT_S, CONTROL_TIMEOUT_S)
        await self.follow_once()
        self._task = asyncio.create_task(self._follow())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._pool is not None:
            self._pool.close()

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(FOLLOW_INTERVAL_S)
            await self.follow_once()

    # ---------------------------------------------------------------- following
    async def follow_once(self) -> None:
        """Read the control router's replica set and make this worker's equal to it."""
        key = self.runtime.config.admin_key  # the replica set is the admin plane's (it names the replicas' URLs)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        try:
            status, _, raw = await self._pool.fetch("GET", self.control_url, "/replicas", CONTROL_TIMEOUT_S,
                                                    headers=headers)
            if status != 200:
                raise ValueError(f"GET /replicas answered {status}")
            rows = ReplicaList.decode(raw).replicas
        except (UpstreamError, OSError, asyncio.TimeoutError, ValueError) as e:
            if not self._failing:
                logger.warning("router worker %d cannot read the control router's replicas (%s); "
                               "keeping its set", self.row, e)
            self._failing = True
            return
        self._failing = False
        self.apply(rows)

    def apply(self, rows: list[ReplicaRow]) -> None:
        self.table.healthy_seen[self.row] = apply_rows(self.runtime, rows)

    # ---------------------------------------------------------------- admin plane
    async def pass_through(self, request: HttpRequest) -> Response:
        """An admin-plane request, answered by the control router (the door's rule for ``answered_by_owner``)."""
        body = await request.body()
        if len(body) > MAX_ADMIN_BODY:
            raise ProtocolError(f"admin request body over {MAX_ADMIN_BODY} bytes", 413)
        headers = {k.decode(): v.decode("latin-1") for k, v in request.raw_headers if k in _PASSED_HEADERS}
        try:
            status, answer_headers, answer = await self._pool.fetch(
                request.method.decode("latin-1"), self.control_url, request.target.decode("latin-1"),
                CONTROL_TIMEOUT_S, body, headers)
            return Response(answer, status, answer_headers.get("content-type", "application/json"))
        except (UpstreamError, OSError, asyncio.TimeoutError) as e:
            raise ProtocolError(f"serve's control router did not answer ({type(e).__name__}); retry", 503) from None


def apply_rows(runtime: RouterRuntime, rows: list[ReplicaRow]) -> int:
    """Make ``runtime``'s replica set equal to the owner's ``rows`` (add / re-register, drain, remove); returns how
    many replicas it routes to. Also used by the routers serve places on Ray nodes (cluster/launch/node_router.py)."""
    wanted = {row.id: row for row in rows}
    for replica in runtime.replicas:
        if replica.spec is not None and replica.id not in wanted:
            runtime.remove_replica(replica.id)
    for replica_id, row in wanted.items():
        spec = ReplicaSpec(url=row.url, events=row.events, replay=row.replay, replica_id=replica_id, role=row.role)
        if replica_id in runtime.draining and not row.draining:
            runtime.remove_replica(replica_id)  # re-registered at the owner: start afresh
        replica = runtime.add_replica(spec)
        if row.draining:
            runtime.drain(replica)
    return len(runtime.router.healthy)
