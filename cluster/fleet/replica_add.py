"""Adding replicas to a running cluster (the fleet's ``add`` step, operations.py)::

    placement group (same bundles, same Ray placement) ─▶ launcher.start_replica ─▶ ready
    ─▶ registered with the router ─▶ healthy in the router (the health gate)

A batch joins whole or not at all: when one of its replicas does not start, every one is killed and
their placement groups freed.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from kvmesh.cluster.config.roles import Role
from kvmesh.cluster.launch.placement import (
    ReplicaPlacement,
    cluster_nodes,
    remove_placement_groups,
    wait_ready,
)
from kvmesh.cluster.launch.supervisor import ReplicaHandle, register


def check_deployment_counts(cluster: RunningCluster, more: dict[str, int]) -> None:
    """``CapacityError`` unless the nodes hold every deployment's replicas with ``more`` added (name -> count)
    (only reported with ``ray.wait_for_nodes``: a Ray autoscaler may add nodes)."""
    from dataclasses import replace

    from kvmesh.cluster.launch.capacity import CapacityError
    from kvmesh.cluster.launch.deployment_capacity import check_deployments_capacity

    have = {u.deployment.name: 0 for u in cluster.units}
    for handle in cluster.state.replicas:
        have[handle.deployment] = have.get(handle.deployment, 0) + 1
    demands = [replace(u.demand, num_replicas=have[u.deployment.name] + more.get(u.deployment.name, 0))
               for u in cluster.units]
    try:
        check_deployments_capacity(cluster_nodes(), demands, embedded=cluster.state.ray.owned)
    except CapacityError as e:
        if not cluster.config.ray.wait_for_nodes:
            raise
        cluster.report(f"the nodes cannot hold the replicas yet: {e.shortfall}")

if TYPE_CHECKING:
    from kvmesh.cluster.launch.deployment_launch import DeploymentUnit
    from kvmesh.cluster.launch.serve_state import RunningCluster, ServeState


def add_replicas(cluster: RunningCluster, indexes: list[int], role: Role,
                 unit: DeploymentUnit | None = None) -> list[ReplicaHandle]:
    """Start replicas ``indexes`` of ``role`` (of deployment ``unit``) in new placement groups; returns once the
    router routes to them."""
    import ray
    from ray.util.placement_group import placement_group

    cfg, st = cluster.config, cluster.state
    if unit is None:
        bundles = cluster.replica_bundles()
        cluster.check_capacity(len(st.replicas) + len(indexes))  # more than the nodes hold: say so at once
    else:  # every deployment's replicas with these added (cluster/launch/deployment_capacity.py)
        bundles = unit.bundles
        check_deployment_counts(cluster, {unit.deployment.name: len(indexes)})
    groups = []
    for i in indexes:
        pg = placement_group(bundles, strategy="STRICT_PACK", name=f"kvmesh-replica-{i}-{time.time_ns()}")
        groups.append(ReplicaPlacement(replica_index=i, placement_group=pg, target_node_id=None))
    st.groups.extend(groups)
    wait_ready(groups, timeout_s=cfg.ray.placement_timeout_s, report=cluster.report)
    handles = [cluster.start_replica(g, role, unit) for g in groups]
    deadline = time.monotonic() + cfg.ray.ready_timeout_s
    try:
        for handle in handles:
            handle.endpoints = ray.get(handle.actor.ready.remote(), timeout=max(1.0, deadline - time.monotonic()))
    except Exception:  # one did not start: none of this batch joins; free what they hold
        for handle in handles:
            ray.kill(handle.actor, no_restart=True)
        remove_placement_groups(groups)
        st.groups[:] = [g for g in st.groups if g not in groups]
        raise
    for handle in handles:
        handle.up = True
        register(st.router_client, handle)
        st.replicas.append(handle)  # the supervisor watches it from now on
    for handle in handles:
        _wait_healthy(st, handle.replica_id, deadline)
        cluster.report(f"{handle.replica_id} added at {handle.endpoints['http_url']} "
                       f"({len(st.replicas)} replicas)")
    return handles


def _wait_healthy(st: ServeState, replica_id: str, deadline: float) -> None:
    """The health gate: the router has probed the replica and routes to it."""
    client = st.router_client
    while time.monotonic() < deadline:
        healthy = client.health().get("healthy_replicas", [])
        if replica_id in healthy:
            if hasattr(st.router, "wait_workers_see"):  # router processes follow the control router
                st.router.wait_workers_see(len(healthy), max(deadline - time.monotonic(), 1.0))
            return
        time.sleep(0.1)
    raise TimeoutError(f"{replica_id} started but the router does not see it healthy")
