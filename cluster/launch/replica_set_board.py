"""The replica set as the cluster sees it: a named, restartable Ray actor every placed router reads.

``kvmesh serve`` owns the replica set (its supervisor, fleet and autoscaler change it at the control router
in the serve process, cluster/launch/serve_router.py). With routers on several Ray nodes
(cluster/launch/node_routers.py) that control router stays on loopback and no router on another node can
reach it, so serve publishes the set through Ray::

    serve process                                    Ray node A, B, ...
      control router ── GET /replicas every 0.25 s ─▶ BoardPublisher
                                                       │ publish(rows)
                                                       ▼
                                     ReplicaSetBoard "kvmesh-replica-set" (named actor, restarted by Ray)
                                                       ▲ read() every 0.25 s
                          NodeRouter 0 ───────────────┤ (cluster/launch/node_router.py: makes its set equal,
                          NodeRouter 1 ───────────────┘  router/control/follow.py's apply_rows)

A board Ray restarts holds nothing until the next publish (a quarter of a second later); a router that reads
nothing, or cannot reach the board, keeps the set it has. Nothing here is shared memory or a file: the rows
travel as Ray objects.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the board's worker process imports this module: it stays free of the router's stack
    from kvmesh.cluster.router_client import RouterClient

logger = logging.getLogger(__name__)

BOARD_NAME = "kvmesh-replica-set"
"""The board's actor name in the cluster's Ray namespace (ray.namespace)."""
PUBLISH_TIMEOUT_S = 5.0
"""Longest wait for the board to take one publish."""


class ReplicaSetBoard:
    """The last replica set the owner published (``GET /replicas``'s body), for routers on every node."""

    def __init__(self) -> None:
        self._rows: bytes | None = None
        self._sync: dict[str, str] = {}

    def publish(self, rows: bytes) -> None:
        self._rows = rows

    def read(self) -> bytes | None:
        """The set's rows as ``ReplicaList`` JSON; None until the owner published (also just after a restart)."""
        return self._rows

    def sync_peers(self, name: str, endpoint: str | None) -> list[str]:
        """Router ``name`` publishes its choices at ``endpoint`` (router/control/router_sync.py; None: it publishes
        none): the other routers' endpoints, as they last said (a restarted board learns them again at their next
        read)."""
        if endpoint is None:
            self._sync.pop(name, None)
        else:
            self._sync[name] = endpoint
        return sorted(e for n, e in self._sync.items() if n != name)


def start_board(namespace: str):
    """The board actor, named, on the serve driver's node; Ray restarts it forever, holding no CPU."""
    import ray

    return ray.remote(ReplicaSetBoard).options(
        name=BOARD_NAME, namespace=namespace, num_cpus=0, max_restarts=-1, max_task_retries=-1).remote()


class BoardPublisher:
    """A thread of the serve process that copies the owner's replica set onto the board."""

    def __init__(self, board, owner: RouterClient) -> None:
        self.board, self.owner = board, owner
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvmesh-replica-set-board", daemon=True)
        self._failing = False

    def start(self) -> BoardPublisher:
        self.publish_once()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(PUBLISH_TIMEOUT_S + 1)
        self.owner.close()

    def _run(self) -> None:
        from kvmesh.router.control.follow import FOLLOW_INTERVAL_S

        while not self._stop.wait(FOLLOW_INTERVAL_S):
            self.publish_once()

    def publish_once(self) -> None:
        import ray
        from kvmesh.router.control.rows import ReplicaList

        try:
            rows = ReplicaList(self.owner.replica_rows()).encode()
            ray.get(self.board.publish.remote(rows), timeout=PUBLISH_TIMEOUT_S)
        except Exception as e:  # noqa: BLE001 - the owner or the board is restarting: the next turn retries
            if not self._failing:
                logger.warning("cannot publish the replica set to the routers' board (%s: %s); retrying",
                               type(e).__name__, str(e).strip().split("\n")[0])
            self._failing = True
            return
        self._failing = False
