"""What joins one router worker process to its siblings (``serve_router``'s ``setup``).

- Every worker publishes its in-flight counts in the host's ``SharedLoadTable`` (its row = its
  index) and routes by the sum of all rows (router/shared_loads.py).
- Inside ``kvmesh serve`` (``control_url`` set) the replica set belongs to serve's control router
  (cluster/serve_router.py): the worker follows it (router/control_follow.py) and passes the admin
  plane (``POST /replicas``, drains, ``/admin/*``) through to it, so a change made through any
  worker reaches them all.

It is a picklable callable: ``RouterWorkers`` hands it to each spawned worker.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvmesh.router.shared_loads import SharedLoadTable


@dataclass
class WorkerSetup:
    table: SharedLoadTable
    """The host's shared in-flight counts (one row per worker)."""
    control_url: str | None = None
    """serve's control router, owner of the replica set; None: the worker's set is its own (``kvmesh router``)."""

    def __call__(self, runtime, app, worker_index: int):
        runtime.router.loads.share(self.table, worker_index)
        if self.control_url is None:
            return app
        from kvmesh.router.control_follow import ControlFollower

        return ControlFollower(runtime, self.control_url, self.table, worker_index).wrap(app)
