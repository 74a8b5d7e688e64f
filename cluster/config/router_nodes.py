"""The ``routers`` section of ``kvmesh serve``: routers on several Ray nodes (cluster/launch/node_routers.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass

EVERY_NODE = -1
"""``num_routers`` value for one router on every Ray node that can hold one."""


@dataclass(frozen=True, slots=True)
class RouterNodesConfig:
    """Where serve's routers run: in the serve process (the default), or as Ray actors on several nodes."""

    num_routers: int = 0
    """Routers placed on Ray nodes, each a restartable Ray actor serving router.port on its node, spread one per
    node while nodes last; -1 = one on every node that can hold one; 0 = the router runs in the serve process."""
    router_resource: str | None = None
    """Custom Ray resource a node must offer to take a router (a node's resources {kvmesh_router: 1} in
    deploy/*.yaml); each router holds 1 of it; None = any node."""
    router_cpus: float = 1.0
    """Ray CPUs each placed router reserves on its node."""
    router_restarts: int = -1
    """How often Ray restarts a placed router that died, on the same node (-1 = forever)."""
    router_sync: bool = True
    """Placed routers tell each other every request they send (router.sync, router/control/router_sync.py: each binds
    an ephemeral port on its node and finds the others' through the replica set's board), so inside a burst none
    decides blind of the others; False: each sees the others' requests only once the replicas publish them."""
    router_ready_timeout_s: float = 60.0
    """How long serve waits for the replica set's board and every placed router to start (saying every 10 s which
    are still starting) and for each router to route to every replica."""

    def __post_init__(self) -> None:
        if self.num_routers < EVERY_NODE:
            raise ValueError(f"routers.num_routers={self.num_routers}; use a count, 0 (the serve process's router) "
                             "or -1 (one on every node)")
        if self.router_resource is not None and not re.fullmatch(r"[A-Za-z0-9_.:-]+", self.router_resource):
            raise ValueError(f"routers.router_resource={self.router_resource!r} is not a Ray resource name "
                             "(letters, digits, _ . : -)")
        if self.router_cpus < 0:
            raise ValueError(f"routers.router_cpus={self.router_cpus} must be >= 0")
        if self.router_restarts < -1:
            raise ValueError(f"routers.router_restarts={self.router_restarts}; use a count or -1 (forever)")
        if not self.router_ready_timeout_s > 0:
            raise ValueError(f"routers.router_ready_timeout_s={self.router_ready_timeout_s} must be positive")

    @property
    def placed(self) -> bool:
        """Routers run as Ray actors on nodes (not in the serve process)."""
        return self.num_routers != 0


def check_router_nodes(routers: RouterNodesConfig, router_workers: int) -> None:
    """A placed router is one process per actor: ``router.workers`` (processes sharing one host's memory) is the
    serve process's router's."""
    if routers.placed and router_workers > 1:
        raise ValueError(f"router.workers={router_workers} with routers.num_routers={routers.num_routers}: a placed "
                         "router is one process; add routers with --num-routers, or leave router.workers at 0")
