"""Can the cluster hold every deployment's replicas at once? Planned for all before any starts.

Replicas of different deployments ask for different bundles, so a node's room is not a count per deployment:
the plan places them one by one on the nodes' resources (Ray's model, as capacity.py: GPUs as unit instances,
fractions carved out of one card, a replica's bundles all on one node), the largest replicas first, each on the
first node that still holds it. ``check_deployments_capacity`` raises ``CapacityError`` saying what each
deployment needs, how many of its replicas found room, and what each node has. Pure (nodes come in as
``NodeResources``): tested without Ray.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvmesh.cluster.launch.capacity import (
    CapacityError,
    NodeResources,
    NodeRoom,
    ReplicaShape,
    _count,
)


@dataclass(frozen=True, slots=True)
class DeploymentDemand:
    """One deployment's replicas, as placement asks for them."""

    name: str
    """The deployment's name (its served model name)."""
    shape: ReplicaShape
    """What one of its replicas asks for."""
    num_replicas: int
    """Its replicas."""


def plan_deployments(nodes: list[NodeResources], demands: list[DeploymentDemand]) -> dict[str, list[str]]:
    """Deployment name -> the node id of each replica that found room (fewer than asked: it does not fit)."""
    left = [NodeRoom(n) for n in nodes]
    placed: dict[str, list[str]] = {d.name: [] for d in demands}
    for d in sorted(demands, key=lambda d: (-d.shape.gpus, -d.shape.cpus)):  # the largest replicas first
        for _ in range(d.num_replicas):
            node = next((n for n in left if n.take(d.shape.bundles)), None)
            if node is None:
                break
            placed[d.name].append(node.node.node_id)
    return placed


def check_deployments_capacity(nodes: list[NodeResources], demands: list[DeploymentDemand],
                               embedded: bool = False) -> dict[str, list[str]]:
    """The plan when the nodes hold every deployment's replicas together; else ``CapacityError``."""
    placed = plan_deployments(nodes, demands)
    if all(len(placed[d.name]) >= d.num_replicas for d in demands):
        return placed
    needs = "; ".join(f"{d.name}: {_count(d.num_replicas, 'replica')} x "
                      + (f"{_count(d.shape.gpus, 'GPU')} and " if d.shape.gpus else "")
                      + f"{_count(d.shape.cpus, 'CPU')} (room for {len(placed[d.name])})" for d in demands)
    gpus = sum(d.num_replicas * d.shape.gpus for d in demands)
    cpus = sum(d.num_replicas * d.shape.cpus for d in demands)
    total = (f"{_count(gpus, 'GPU')} and " if gpus else "") + _count(cpus, "CPU")
    there = "; ".join(n.describe() for n in nodes) or "no alive node"
    more = ("a higher --num-cpus (serve starts this Ray itself), or join a Ray cluster that has them (--address)"
            if embedded else "add nodes (when a Ray autoscaler adds them on demand, pass --wait-for-nodes)")
    raise CapacityError(f"the deployments need {total} in all ({needs}); the cluster has {there}",
                        f"Lower a deployment's num_replicas or gpus_per_replica, or {more}.")
