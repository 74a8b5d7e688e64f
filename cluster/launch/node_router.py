"""One router serve places on a Ray node: a restartable actor that serves ``router.port`` on its node.

The actor builds a whole router (``RouterServer``: its own index fed by every replica's event stream, its own
load view from ``/load`` polls and its own bookings) and starts it in ``__init__``, so a router Ray restarts
after a crash listens again by itself: it takes the replica set from the board (replica_set_board.py) before
it listens, and its index converges from each replica's replay and snapshot as any late subscriber's does.
It shares no memory and no file with any other router: what routers agree on travels as the replicas' event
streams and the board's Ray objects.

Requests for the replica set's owner (``answered_by_owner``: changes to the set, ``/admin/*``) get a 421 naming
where they go: the control router of the serve process (``kvmesh status`` on the head node).
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import replace
from typing import TYPE_CHECKING

from kvmesh.replica.serving.errors import ProtocolError
from kvmesh.router.control.admin_routes import answered_by_owner
from kvmesh.router.control.follow import FOLLOW_INTERVAL_S, apply_rows
from kvmesh.router.control.rows import ReplicaList
from kvmesh.router.http.messages import HttpRequest, Response

if TYPE_CHECKING:
    from kvmesh.router.config import RouterConfig
    from kvmesh.router.control.router_server import RouterServer

logger = logging.getLogger(__name__)

ROUTER_HEADER = b"x-kvmesh-router"
"""Response header naming the placed router that answered (``router-<i>``)."""


class BoardFollower:
    """A placed router's link to the board: reads the replica set every ``FOLLOW_INTERVAL_S`` and makes its own
    equal, and notes the requests its admission holds for the owner's autoscaler (a companion of its
    ``RouterServer``, on the router's loop: the actor's calls come on another thread and read what it noted)."""

    def __init__(self, server: RouterServer, board, name: str) -> None:
        self.runtime, self.board, self.name = server.runtime, board, name
        self.healthy_seen = 0
        """Replicas this router routes to, as of the last read."""
        self.waiting = 0
        """Requests this router's admission holds that no replica has yet, as of the last turn."""
        self._task: asyncio.Task | None = None
        self._failing = False

    async def start(self) -> None:
        await self.follow_once()
        self._task = asyncio.create_task(self._follow())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(FOLLOW_INTERVAL_S)
            await self.follow_once()

    async def follow_once(self) -> None:
        admission = self.runtime.admission
        self.waiting = 0 if admission is None else admission.admission.waiting()
        sync = self.runtime.sync
        try:
            raw = await asyncio.wrap_future(self.board.read.remote().future())
            if sync is not None:  # say where this router publishes its choices, and follow the others'
                sync.set_peers(await asyncio.wrap_future(self.board.sync_peers.remote(self.name, sync.endpoint)
                                                         .future()))
        except Exception as e:  # noqa: BLE001 - the board is restarting: keep the set, read again next turn
            if not self._failing:
                logger.warning("placed router cannot read the replica set board (%s); keeping its set",
                               type(e).__name__)
            self._failing = True
            return
        self._failing = False
        if raw is not None:  # None: a restarted board the owner has not published to yet
            self.healthy_seen = apply_rows(self.runtime, ReplicaList.decode(raw).replicas)


async def refuse_owner_request(request: HttpRequest) -> Response:
    raise ProtocolError("this router follows the replica set kvmesh serve owns; send replica-set and /admin/* "
                        "requests to serve's control router (its URL is in `kvmesh serve`'s output and the cluster "
                        "record kvmesh scale/drain read)", 421)


class NodeRouter:
    """The Ray actor (cluster/launch/node_routers.py places it): the router serving on this node."""

    def __init__(self, config: RouterConfig, name: str, board_name: str, namespace: str, sync: bool = False) -> None:
        """``sync``: publish this router's choices on an ephemeral port of its node and follow the other placed
        routers' (router.sync; their endpoints meet on the board)."""
        import ray
        from kvmesh.replica.openai.malloc_arenas import cap_malloc_arenas
        from kvmesh.router.control.router_server import RouterServer

        cap_malloc_arenas()  # a worker on another node did not inherit serve's cap
        node_ip = ray.util.get_node_ip_address()
        host = node_ip if config.host == "auto" else config.host
        if sync:  # a wildcard router.host still publishes on the node's own address: the others connect to it
            sync_host = node_ip if host in ("auto", "0.0.0.0", "::") else host
            config = replace(config, sync=replace(config.sync, bind=f"tcp://{_zmq_host(sync_host)}:0"))
        self.name = name
        self.server = RouterServer(replace(config, host=host, workers=1),
                                   extra_headers=[(ROUTER_HEADER, name.encode())])
        self.follower = BoardFollower(self.server, ray.get_actor(board_name, namespace=namespace), name)
        self.server.companions.append(self.follower)
        self.server.door.add_rule(answered_by_owner, refuse_owner_request)
        self.server.start(timeout=120.0)

    def url(self) -> str:
        return self.server.url

    def pid(self) -> int:
        return os.getpid()

    def node_id(self) -> str:
        """The Ray node this router runs on (Ray restarts it on the same one)."""
        import ray

        return ray.get_runtime_context().get_node_id()

    def healthy_seen(self) -> int:
        """Replicas this router routes to."""
        return self.follower.healthy_seen

    def waiting(self) -> int:
        """Requests this router's admission holds (its ``GET /replicas`` ``waiting``; the owner's autoscaler counts
        them)."""
        return self.follower.waiting

    def sync_counters(self) -> dict | None:
        """Its sync stream's counters (``RouterSync.counters``; None: sync off)."""
        sync = self.server.runtime.sync
        return None if sync is None else sync.counters()

    def stop(self) -> None:
        self.server.stop()


def _zmq_host(host: str) -> str:
    """``host`` as a ZeroMQ tcp endpoint writes it (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host else host
