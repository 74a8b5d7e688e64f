"""Removing a replica from a running cluster (the fleet's ``remove`` step, operations.py)::

    router drain (no new requests) ─▶ its in-flight requests finish (streams to their last byte; at most
    autoscale.drain_timeout_s) ─▶ router deregisters it (its index is dropped) ─▶ actor shut down
    ─▶ placement group removed
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from kvmesh.cluster.launch.placement import remove_placement_groups
from kvmesh.cluster.launch.supervisor import ReplicaHandle, actor_state, replica_index

if TYPE_CHECKING:
    from kvmesh.cluster.launch.serve_state import RunningCluster

logger = logging.getLogger(__name__)


def remove_replica(cluster: RunningCluster, handle: ReplicaHandle, drain_timeout_s: float) -> None:
    """Drain ``handle``'s replica, wait for its requests, deregister it, stop the actor, free its group."""
    import ray

    st, client, replica_id = cluster.state, cluster.state.router_client, handle.replica_id
    t0 = time.monotonic()
    in_flight_at_drain = client.drain(replica_id)["in_flight"]
    in_flight = -1
    while time.monotonic() - t0 < drain_timeout_s:
        row = next((r for r in client.replicas() if r["id"] == replica_id), None)
        in_flight = row["in_flight"] if row else 0
        if in_flight == 0:
            break
        time.sleep(0.1)
    if in_flight:
        cluster.report(f"{replica_id}: {in_flight} request(s) still running after "
                       f"{drain_timeout_s:g}s (autoscale.drain_timeout_s); removing it anyway")
    st.replicas.remove(handle)  # the supervisor stops watching it (its endpoints stay: no re-registration)
    client.deregister(replica_id)
    try:
        ray.get(handle.actor.shutdown.remote(2.0), timeout=10)
    except Exception as e:  # already gone: nothing to stop
        logger.debug("shutdown %s: %s", replica_id, e)
    ray.kill(handle.actor, no_restart=True)
    deadline = time.monotonic() + 10  # its actor name is free for a later replica only once it is dead
    while actor_state(handle.actor) not in ("DEAD", "UNKNOWN") and time.monotonic() < deadline:
        time.sleep(0.1)
    index = replica_index(replica_id)
    remove_placement_groups([g for g in st.groups if g.replica_index == index])
    st.groups[:] = [g for g in st.groups if g.replica_index != index]
    cluster.report(f"{replica_id} drained in {time.monotonic() - t0:.1f}s ({in_flight_at_drain} "
                   f"request(s) in flight finished) and removed ({len(st.replicas)} replicas)")
