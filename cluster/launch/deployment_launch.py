"""Starting several deployments (``deployments.models``) behind the one router of ``kvmesh serve``.

    preflight:  every deployment's model resolves; the router's and all replicas' fixed ports are free; on an
                embedded Ray, its one node holds every deployment's replicas together
    start:      each deployment's model on the nodes, its engine section (``deployment_config``: the engine
                section with the deployment's fields on top, the cluster's hash seed) ─▶ placement planned for
                ALL deployments together (deployment_capacity.py), refused at once with what is needed vs there
                ─▶ each deployment's placement groups and replica actors, with its own engine and served name

Replicas share one index space across deployments (``replica-0`` ... in the order of the deployments): an index
gives a replica's ports (``http_port + i``, ``event_port + 2i``) and its name, as with one model. Each replica
reports the name it serves; the router pools replicas by it (``"model"``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace

from kvmesh.cluster.config.deployments import Deployment, deployment_config
from kvmesh.cluster.config.trees import ServeConfig
from kvmesh.cluster.launch.capacity import CapacityError, ReplicaShape
from kvmesh.cluster.launch.deployment_capacity import DeploymentDemand, check_deployments_capacity
from kvmesh.cluster.launch.embedded_model import SERVED_NAME
from kvmesh.cluster.launch.model_files import check_model, hub_reachable, resolve_model_path
from kvmesh.cluster.launch.placement import (
    ReplicaPlacement,
    cluster_nodes,
    create_placement_groups,
    replica_bundles,
    wait_ready,
)
from kvmesh.cluster.launch.ray_cluster import RayHandle
from kvmesh.cluster.launch.replica_sections import replica_engine
from kvmesh.replica.config import EngineConfig


@dataclass(frozen=True, slots=True)
class DeploymentUnit:
    """One deployment as its replicas start: its one-model config, resolved model, engine and served name."""

    deployment: Deployment
    """The deployment as configured."""
    config: ServeConfig
    """The serve config as a one-model cluster of this deployment (``deployment_config``)."""
    model_path: str
    """The model directory its replicas load."""
    engine: EngineConfig
    """The engine section its replicas start with (the cluster's hash seed in it)."""
    served_model_name: str
    """The name its requests give as "model"."""
    bundles: list[dict[str, float]]
    """One replica's placement-group bundles."""

    @property
    def demand(self) -> DeploymentDemand:
        c = self.config
        gpus = c.gpus_per_worker if any("GPU" in b for b in self.bundles) else 0.0
        return DeploymentDemand(self.deployment.name, ReplicaShape(c.engine.tensor_parallel_size, gpus, self.bundles),
                                self.deployment.num_replicas)


def served_name(config: ServeConfig, deployment: Deployment) -> str:
    """What a deployment's requests give as "model": its served_model_name, else the embedded model's name or
    its model as given."""
    return deployment.served_model_name or (SERVED_NAME if deployment.model == "embedded" else deployment.model)


def preflight_deployments(config: ServeConfig, check_port_free: Callable[[str, int, str], None]) -> None:
    """Every deployment's model resolves and every fixed port of this machine is free (ValueError otherwise);
    an embedded Ray's node holds all the replicas (checked with the nodes once Ray runs: ``start_units``)."""
    for d in config.deployments.models:
        if d.model == "embedded":
            continue
        try:
            path = check_model(d.model)
        except ValueError as e:
            raise ValueError(f"deployment {d.name}: {e}") from None
        if not os.path.isdir(path) and not hub_reachable():
            os.environ["HF_HUB_OFFLINE"] = "1"  # a cached hub id and no hub: the replicas load from the cache
    if config.router.host != "auto" or config.is_embedded_ray:
        check_port_free("127.0.0.1" if config.router.host == "auto" else config.router.host, config.router.port,
                        "router.port")
    if config.is_embedded_ray:
        total = sum(d.num_replicas for d in config.deployments.models)
        rc = config.replicas
        for port in rc.http_ports(total):
            check_port_free("127.0.0.1", port, "replicas.http_port")
        for pair in rc.event_ports(total):
            for port in pair:
                check_port_free("127.0.0.1", port, "replicas.event_port")


def plan_units(config: ServeConfig, handle: RayHandle, device: str, hash_seed: str,
               report: Callable[[str], None]) -> list[DeploymentUnit]:
    """Each deployment resolved for its replicas (its model on the nodes, its engine section)."""
    units = []
    for d in config.deployments.models:
        one = deployment_config(config, d)
        path = resolve_model_path(one, handle, lambda line, name=d.name: report(f"{name}: {line}"))
        bundles = replica_bundles(one.engine.tensor_parallel_size, one.replicas.num_cpus_per_worker, device,
                                     one.gpus_per_worker)
        units.append(DeploymentUnit(d, one, path, replica_engine(one, path, device, hash_seed),
                                    served_name(config, d), bundles))
    return units


def place_units(config: ServeConfig, units: list[DeploymentUnit], embedded: bool,
                report: Callable[[str], None]) -> list[tuple[DeploymentUnit, ReplicaPlacement]]:
    """Placement for every deployment's replicas, checked together first (``CapacityError`` at once unless
    ``ray.wait_for_nodes``); then each replica's placement group, indexed across deployments."""
    try:
        check_deployments_capacity(cluster_nodes(), [u.demand for u in units], embedded=embedded)
    except CapacityError as e:
        if not config.ray.wait_for_nodes:
            raise
        report(f"the nodes cannot hold the deployments yet: {e.shortfall}; waiting up to "
               f"{config.ray.placement_timeout_s:g}s for the Ray autoscaler to add nodes")
    placed: list[tuple[DeploymentUnit, ReplicaPlacement]] = []
    for unit in units:
        n = unit.deployment.num_replicas
        report(f"placing {n} replica(s) of {unit.served_model_name}: {unit.config.engine.tensor_parallel_size} "
               f"worker(s) each, bundles {unit.bundles}")
        groups = create_placement_groups(n, unit.bundles, config.ray.placement,
                                            name_prefix=f"kvmesh-{unit.deployment.name}".replace("/", "-"))
        offset = len(placed)
        placed += [(unit, replace(g, replica_index=offset + g.replica_index)) for g in groups]
    wait_ready([g for _, g in placed], timeout_s=config.ray.placement_timeout_s, report=report)
    return placed
