"""Removing a replica from a running cluster (the fleet's ``remove`` step, operations.py)::

    router drain (no new requests) ─▶ its in-flight requests finish (with routers on other hosts: the replica's own
    count of running requests too, once they have all seen the drain) (streams to their last byte; at most
    autoscale.drain_timeout_s) ─▶ router deregisters it (its index is dropped) ─▶ actor shut down
    ─▶ placement group removed
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from kvmesh.cluster.launch.placement import remove_placement_groups
from kvmesh.cluster.launch.supervisor import ReplicaHandle, actor_state, replica_index
from kvmesh.router.control.follow import FOLLOW_INTERVAL_S

if TYPE_CHECKING:
    from kvmesh.cluster.launch.serve_state import RunningCluster
    from kvmesh.cluster.router_client import RouterClient

logger = logging.getLogger(__name__)


def placed_routers_settle_s(cluster: RunningCluster) -> float:
    """With routers on Ray nodes (cluster/launch/node_routers.py), how long until every one has seen a drain (two
    reads of the board) and the owner has polled the replica's ``/load`` since (two polls); 0 without them."""
    if not cluster.config.routers.placed:
        return 0.0
    return 2 * FOLLOW_INTERVAL_S + 2 * cluster.config.router.upstream.poll_interval_s


def wait_drained(client: RouterClient, replica_id: str, timeout_s: float, settle_s: float = 0.0) -> int:
    """Wait until the drained replica has no request in flight, at most ``timeout_s``; returns what is left. With
    ``settle_s`` (routers on other hosts, whose bookings the owner does not see) the replica's own count of running
    requests counts too, read once every router has seen the drain."""
    t0 = time.monotonic()
    time.sleep(min(settle_s, timeout_s))
    in_flight = -1
    while True:
        row = next((r for r in client.replicas() if r["id"] == replica_id), None)
        in_flight = (max(row["in_flight"], row.get("running", 0) if settle_s else 0)) if row else 0
        if in_flight == 0 or time.monotonic() - t0 >= timeout_s:
            return in_flight
        time.sleep(0.1)


def remove_replica(cluster: RunningCluster, handle: ReplicaHandle, drain_timeout_s: float) -> None:
    """Drain ``handle``'s replica, wait for its requests, deregister it, stop the actor, free its group."""
    import ray

    st, client, replica_id = cluster.state, cluster.state.router_client, handle.replica_id
    t0 = time.monotonic()
    in_flight_at_drain = client.drain(replica_id)["in_flight"]
    in_flight = wait_drained(client, replica_id, drain_timeout_s, placed_routers_settle_s(cluster))
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
