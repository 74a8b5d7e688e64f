"""The fleet of a cluster of several deployments (``deployments.models``): scale and roll out one
deployment's replicas by its name.

    kvmesh scale 3 --deployment llama      that deployment's replicas to 3 (placement checked for every
                                           deployment's replicas with the new ones, at once)
    kvmesh rollout --deployment llama ...  its replicas replaced one at a time, with engine changes on its own
                                           engine section
    kvmesh drain replica-4                 any replica; the deployment keeps at least one

Everything else (the worker thread, drains, new indexes) is ``Fleet``'s. A cluster of one deployment takes no
``--deployment``; several need one.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from kvmesh.cluster.config.gpu_share import check_gpu_share
from kvmesh.cluster.fleet.operations import Fleet
from kvmesh.cluster.fleet.replica_add import add_replicas
from kvmesh.cluster.fleet.view import Accepted, EngineChanges, FleetView
from kvmesh.cluster.launch.supervisor import ReplicaHandle
from kvmesh.router.replicas.roles import PREFILL

if TYPE_CHECKING:
    from kvmesh.cluster.launch.deployment_launch import DeploymentUnit
    from kvmesh.replica.config import EngineConfig


class DeploymentFleet(Fleet):
    """``Fleet`` whose scale and rollout name a deployment."""

    def unit(self, deployment: str | None) -> DeploymentUnit:
        """The deployment ``deployment`` names (the only one when None); ValueError naming them otherwise."""
        units = self.cluster.units
        names = [u.deployment.name for u in units]
        if deployment is None and len(units) == 1:
            return units[0]
        if deployment is None:
            raise ValueError(f"this cluster runs several deployments ({', '.join(names)}): name one with --deployment")
        for u in units:
            if u.deployment.name == deployment:
                return u
        raise ValueError(f"no deployment {deployment!r}; this cluster runs {', '.join(names)}")

    def deployment_ids(self, deployment: str) -> list[str]:
        """The replicas of ``deployment``."""
        return [h.replica_id for h in list(self.st.replicas) if h.deployment == deployment]

    def state(self) -> FleetView:
        view = super().state()
        view["deployments"] = {h.replica_id: h.deployment for h in list(self.st.replicas)}
        return view

    def request_scale(self, replicas: int, role: str | None = None, deployment: str | None = None) -> Accepted:
        if role == PREFILL:
            raise ValueError("a cluster of deployments has no prefill replicas")
        name = self.unit(deployment).deployment.name
        if replicas < 1:
            raise ValueError(f"cannot scale {name} to {replicas} replicas: a deployment keeps at least 1")
        operation = f"scale {name} to {replicas}"
        self.enqueue(operation, self.scale_deployment, name, replicas)
        return {"accepted": True, "operation": operation, "replicas": self.deployment_ids(name),
                "role": self.serving_role,
                "deployment": name}

    def scale_deployment(self, name: str, replicas: int) -> None:
        """``name``'s replicas to ``replicas``: new ones started, extra ones drained (the cheapest to lose first)."""
        from kvmesh.cluster.fleet.autoscaler import cheapest_to_lose

        have = len(self.deployment_ids(name))
        if have < replicas:
            self.add_of(name, replicas - have)
        while len(ids := self.deployment_ids(name)) > replicas and not self._stop.is_set():
            rows = self.st.router_client.replicas(drain_cost=True)
            self.remove_replica(cheapest_to_lose([r for r in rows if r["id"] in ids]))
        self.target = len(self.serving_ids())

    def add_of(self, name: str, count: int) -> list[ReplicaHandle]:
        """Start ``count`` replicas of deployment ``name``."""
        return add_replicas(self.cluster, self.new_indexes(count), self.serving_role, self.unit(name))

    def request_remove(self, replica_id: str) -> bool:
        handle = next((h for h in list(self.st.replicas) if h.replica_id == replica_id), None)
        if handle is not None and len(self.deployment_ids(handle.deployment)) <= 1:
            raise ValueError(f"{replica_id} is the last replica of {handle.deployment}: draining it would leave none "
                             f"to serve it. Start another first (`kvmesh scale 2 --deployment {handle.deployment}`)")
        return super().request_remove(replica_id)

    def request_rollout(self, engine: EngineChanges | None = None, deployment: str | None = None) -> Accepted:
        queued = list(self._ops.queue)
        if self.busy and self.busy.startswith("rollout") or any(op[0].startswith("rollout") for op in queued):
            raise RuntimeError("a rolling restart is already running; GET /admin/fleet shows its progress")
        unit = self.unit(deployment)
        new_engine = unit.engine
        if engine:
            try:
                new_engine = replace(unit.engine, **engine)
                check_gpu_share(unit.config.replicas.gpus_per_replica, new_engine.tensor_parallel_size,
                                new_engine.gpu_memory_utilization)
            except (TypeError, ValueError) as e:
                raise ValueError(f"bad engine settings {engine}: {e}") from None
        name = unit.deployment.name
        self.enqueue(f"rollout {name}", self.rollout_deployment, name, new_engine)
        return {"accepted": True, "operation": f"rollout {name}", "replicas": self.deployment_ids(name),
                "engine_changes": sorted(engine or {}), "deployment": name}

    def rollout_deployment(self, name: str, engine: EngineConfig) -> None:
        """Replace ``name``'s replicas one at a time by ones with ``engine``: a new one passes the health gate
        before an old one drains."""
        import time

        units = self.cluster.units
        k = next(i for i, u in enumerate(units) if u.deployment.name == name)
        units[k] = replace(units[k], engine=engine)
        for replica_id in self.deployment_ids(name):
            if self._stop.is_set():
                return
            t0 = time.monotonic()
            (new,) = self.add_of(name, 1)
            self.remove_replica(replica_id)
            self.cluster.report(f"rollout {name}: {replica_id} -> {new.replica_id} in {time.monotonic() - t0:.1f}s")
