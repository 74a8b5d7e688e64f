"""Routers on several Ray nodes (``routers.num_routers``): serve's control router plus placed router actors.

    serve process (the replica set's owner)            Ray node A            Ray node B
      supervisor, fleet, autoscaler                      router-0 :port        router-1 :port   ◀── clients,
        │ register / drain / remove                        ▲                     ▲                 through an
        ▼                                                  │ read every 0.25 s   │                 L4 balancer
      control router (127.0.0.1:ephemeral) ─▶ board ───────┴─────────────────────┘                 or DNS
                                 (replica_set_board.py: a named, restartable Ray actor)

Each placed router (node_router.py) is a Ray actor pinned to its node (hard node affinity, so Ray restarts it
there), listening on ``router.port`` of that node: its address with ``router.host`` auto in a Ray cluster,
loopback on one machine, or what router.host names. Nodes are taken in Ray's order, one router each while nodes
last (a fixed port holds one router per node; with port 0 several may share a node). A node qualifies when it is
alive and offers ``routers.router_resource`` (when set) and ``routers.router_cpus``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from kvmesh.cluster.config.router_nodes import EVERY_NODE, RouterNodesConfig
from kvmesh.cluster.launch.node_router import NodeRouter
from kvmesh.cluster.launch.readiness import NOTE_EVERY_S
from kvmesh.cluster.launch.replica_set_board import BOARD_NAME, BoardPublisher, start_board
from kvmesh.cluster.launch.serve_router import RouterProcesses
from kvmesh.cluster.launch.supervisor import actor_state
from kvmesh.cluster.router_client import RouterClient
from kvmesh.router.config import RouterConfig

if TYPE_CHECKING:
    from ray import ObjectRef

logger = logging.getLogger(__name__)

NODE_HOSTS = ("auto", "127.0.0.1", "::1", "localhost", "0.0.0.0", "::")
"""router.host values every node can bind (auto: each node's own address)."""
ROUTER_NAME = "kvmesh-router-{index}"
"""A placed router's actor name in the cluster's Ray namespace."""
WAITING_TIMEOUT_S = 1.0
"""How long the autoscaler waits for the placed routers to say how many requests they hold."""


def router_nodes(nodes: list[dict], routers: RouterNodesConfig, port: int, host: str = "auto") -> list[str]:
    """The node id each placed router goes to, from ``ray.nodes()`` (ValueError when none can hold one, or when
    ``host`` is an address only one of them has)."""
    fit = [n["NodeID"] for n in nodes if n.get("Alive")
           and n.get("Resources", {}).get("CPU", 0.0) >= routers.router_cpus
           and (routers.router_resource is None or n.get("Resources", {}).get(routers.router_resource, 0.0) >= 1)]
    what = f"resource {routers.router_resource!r} and " if routers.router_resource else ""
    if not fit:
        raise ValueError(f"no Ray node offers {what}{routers.router_cpus} CPU for a router "
                         "(routers.router_resource, routers.router_cpus)")
    count = len(fit) if routers.num_routers == EVERY_NODE else routers.num_routers
    if host not in NODE_HOSTS and len(set(fit[:count])) > 1:
        raise ValueError(f"router.host={host} is one machine's address, and routers go to {min(count, len(fit))} "
                         "nodes; use auto (each node's own address), 127.0.0.1 or a wildcard")
    if port and count > len(fit):
        raise ValueError(f"routers.num_routers={count} but {len(fit)} node(s) can hold a router, and router.port="
                         f"{port} holds one router per node; add nodes, lower the count, or use router.port 0")
    return [fit[i % len(fit)] for i in range(count)]


class NodeRouters(RouterProcesses):
    """The control router in this process (owner of the replica set) and routers placed on Ray nodes."""

    def __init__(self, config: RouterConfig, routers: RouterNodesConfig, namespace: str,
                 report: Callable[[str], None] = print) -> None:
        super().__init__(config, 1)
        self.routers, self.namespace, self.report = routers, namespace, report
        self.actors: list = []
        """The placed routers' actor handles, ``router-<i>`` in order."""
        self.board = None
        self.publisher: BoardPublisher | None = None

    @property
    def urls(self) -> list[str]:
        """Each placed router's URL (asked again: a restarted router on port 0 listens elsewhere)."""
        import ray

        return ray.get([actor.url.remote() for actor in self.actors])

    @property
    def url(self) -> str:
        return self.urls[0]

    def start(self) -> NodeRouters:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self.control.start()
        try:
            started = time.monotonic()
            self.board = start_board(self.namespace)
            cfg = self.routers
            resources = {cfg.router_resource: 1.0} if cfg.router_resource else {}
            nodes = router_nodes(ray.nodes(), cfg, self.config.port, self.config.host)
            _warn_unshared_responses(self.config, ray.nodes(), nodes)
            for index, node_id in enumerate(nodes):
                self.actors.append(ray.remote(NodeRouter).options(
                    name=ROUTER_NAME.format(index=index), namespace=self.namespace, num_cpus=cfg.router_cpus,
                    resources=resources, max_restarts=cfg.router_restarts,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
                ).remote(replace(self.config, workers=1), f"router-{index}", BOARD_NAME, self.namespace,
                         cfg.router_sync and len(nodes) > 1))
            self._wait_started({"the replica set's board": (self.board, self.board.read.remote())}, started)
            owner = RouterClient(self.control_url, admin_key=self.config.admin_key)
            self.publisher = BoardPublisher(self.board, owner).start()
            self._wait_started({f"router-{i} (node {node_id[:8]})": (actor, actor.url.remote())
                                for i, (actor, node_id) in enumerate(zip(self.actors, nodes, strict=True))}, started)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_started(self, pending: dict[str, tuple], started: float) -> None:
        """Until each named actor (name: (handle, its first call)) answers (a start-up error is raised here),
        saying every ``NOTE_EVERY_S`` which are still starting; routers.router_ready_timeout_s after ``started``
        a TimeoutError names them with their Ray state."""
        import ray

        timeout_s = self.routers.router_ready_timeout_s
        names = {ref: name for name, (_, ref) in pending.items()}
        waiting, last_note = list(names), time.monotonic()
        while waiting:
            done, waiting = ray.wait(waiting, num_returns=len(waiting), timeout=1.0)
            ray.get(done)
            now = time.monotonic()
            if waiting and (now - started > timeout_s or now - last_note >= NOTE_EVERY_S):
                late = "; ".join(f"{names[ref]}: {actor_state(pending[names[ref]][0])}" for ref in waiting)
                if now - started > timeout_s:
                    raise TimeoutError(f"not started after {timeout_s:g}s (routers.router_ready_timeout_s): {late} "
                                       "(PENDING_CREATION: its node lacks routers.router_cpus or the router resource, "
                                       "or its worker process is still starting on a loaded machine); see the Ray logs")
                last_note = now
                self.report(f"waiting for {late} [{now - started:.0f}s of {timeout_s:g}s]")

    def ask_waiting(self) -> list[PlacedWaiting]:
        """Every placed router asked at once how many requests its admission holds (the autoscaler's
        ``HoldsRequests``, cluster/fleet/autoscale_loop.py), each answer awaited ``WAITING_TIMEOUT_S`` from now."""
        deadline = time.monotonic() + WAITING_TIMEOUT_S
        return [PlacedWaiting(f"router-{i}", actor.waiting.remote(), deadline) for i, actor in enumerate(self.actors)]

    def wait_workers_see(self, replicas: int, timeout_s: float = 30.0) -> None:
        """Block until every placed router routes to ``replicas`` healthy replicas (TimeoutError after the
        longer of ``timeout_s`` and routers.router_ready_timeout_s)."""
        import ray

        deadline = time.monotonic() + max(timeout_s, self.routers.router_ready_timeout_s)
        while True:
            seen = ray.get([actor.healthy_seen.remote() for actor in self.actors])
            if min(seen) >= replicas:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"placed routers see {seen} of {replicas} replicas healthy")
            time.sleep(0.1)

    def stop(self) -> None:
        import ray

        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors = []
        if self.publisher is not None:
            self.publisher.stop()
        if self.board is not None:
            ray.kill(self.board, no_restart=True)
        self.publisher, self.board = None, None
        self.control.stop()


@dataclass(frozen=True, slots=True)
class PlacedWaiting:
    """One placed router's answer to "how many requests does your admission hold", asked already."""

    name: str
    answer: ObjectRef[int]
    """The Ray object its ``NodeRouter.waiting`` call returns."""
    deadline: float
    """``time.monotonic()`` past which ``waiting`` gives up (GetTimeoutError)."""

    def waiting(self) -> int:
        import ray

        return int(ray.get(self.answer, timeout=max(0.0, self.deadline - time.monotonic())))


def _warn_unshared_responses(config: RouterConfig, ray_nodes: list[dict], chosen: list[str]) -> None:
    """Routers on several hosts keep stored responses in each host's SQLite file unless router.responses.dsn names
    one PostgreSQL database: say so once, at start."""
    hosts = {n.get("NodeManagerAddress") for n in ray_nodes if n.get("NodeID") in chosen}
    if config.responses.dsn is None and len(hosts) > 1:
        logger.warning("routers on %d hosts keep stored responses in each host's own SQLite file: a "
                       "previous_response_id through another host's router is a 404. Give router.responses.dsn "
                       "(KVMESH_ROUTER_RESPONSES_DSN) a PostgreSQL database to share them", len(hosts))
