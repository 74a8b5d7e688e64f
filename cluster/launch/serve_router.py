"""serve's router: one in-process router, or (``router.workers`` > 1) a control router plus workers.

With one worker the router runs in the serve process (``RouterServer``), replica set, fleet and
autoscaler included. With N > 1::

    serve process                                        router.port (one shared accept queue)
      supervisor, fleet, autoscaler                        worker 0 ─┐ routes, own index,
        │ register / drain / remove                        worker 1 ─┤ follows the control router's
        ▼                                                  ...      ─┘ replica set every 0.25 s,
      control router (127.0.0.1:ephemeral) ◀─ GET /replicas ─────────  passes admin requests to it
        owns the replica set; reads the workers'                    │
        in-flight counts (shared memory) ◀──────────── each writes its row ┘

The control router carries no client traffic: it is the one owner of the replica set (serve's
supervisor and fleet talk to it, as they talk to the in-process router with one worker), and its
``/replicas`` shows every worker's in-flight requests, so drains wait for them and the autoscaler
sees the whole load. Workers follow it (router/control/follow.py); an admin request sent to the
public port lands on some worker, which passes it through to the control router.
"""

from __future__ import annotations

import time
from dataclasses import replace

from kvmesh.cluster.config.trees import ServeConfig
from kvmesh.router.config import RouterConfig


def num_router_workers(config: ServeConfig) -> int:
    """``router.workers``, with 0 (auto) resolved: the cores the head node can spare after the replicas'
    CPUs (all replicas counted, as an embedded Ray places them here), at least 1."""
    if config.router.workers:
        return config.router.workers
    from kvmesh.cluster.launch.placement import replica_bundles
    from kvmesh.router.control.workers import spare_cores

    bundles = replica_bundles(config.engine.tensor_parallel_size, config.replicas.num_cpus_per_worker, "cpu")
    return spare_cores(config.replicas.num_started * sum(b["CPU"] for b in bundles))


def start_router(config: RouterConfig, num_workers: int):
    """The router serve runs: ``RouterServer`` (one worker) or ``RouterProcesses``; started."""
    if num_workers <= 1:
        from kvmesh.router.control.router_server import RouterServer

        return RouterServer(replace(config, workers=1)).start()
    return RouterProcesses(config, num_workers).start()


class RouterProcesses:
    """A control router in this process and ``num_workers`` router processes on ``config.port``."""

    def __init__(self, config: RouterConfig, num_workers: int) -> None:
        from kvmesh.router.control.router_server import RouterServer

        self.config = replace(config, workers=num_workers)
        self.control = RouterServer(replace(config, host="127.0.0.1", port=0, workers=1))
        """Owner of the replica set; serve's supervisor and fleet talk to it (``control_url``)."""
        self.workers = None
        """router/control/workers.py's ``RouterWorkers`` once started."""

    @property
    def runtime(self):
        """The control router's runtime (``fleet`` is set on it; its metrics registry carries the fleet's)."""
        return self.control.runtime

    @property
    def control_url(self) -> str:
        return self.control.url

    @property
    def url(self) -> str:
        host = self.config.host
        return f"http://[{host}]:{self.workers.port}" if ":" in host else f"http://{host}:{self.workers.port}"

    def start(self) -> RouterProcesses:
        from kvmesh.router.control.workers import router_workers

        self.control.start()
        try:
            self.workers = router_workers(replace(self.config, workers=1), [], self.config.workers,
                                          control_url=self.control_url)
        except BaseException:
            self.control.stop()
            raise
        self.control.runtime.router.loads.share(self.workers.table, None)  # reads every worker's row
        self.workers.start()
        return self

    def wait_workers_see(self, replicas: int, timeout_s: float = 30.0) -> None:
        """Block until every worker routes to ``replicas`` healthy replicas (TimeoutError after ``timeout_s``)."""
        seen = self.workers.table.healthy_seen
        deadline = time.monotonic() + timeout_s
        while min(seen) < replicas:
            if self.workers.failed:
                raise RuntimeError(self.workers.failed)
            if time.monotonic() > deadline:
                raise TimeoutError(f"router workers see {list(seen)} of {replicas} replicas healthy after "
                                   f"{timeout_s:.0f}s")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.workers is not None:
            self.workers.stop()
        self.control.stop()

