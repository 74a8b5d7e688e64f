"""The cluster's internal key (the KV plane's): serve generates one per run and hands the same key to its router
and to every replica it starts -- at start, added later (scale, rollout) or restarted by the supervisor -- inside
their config objects, never printed."""

from __future__ import annotations

from kvmesh.cluster.config.loader import from_dict
from kvmesh.cluster.launch.launcher import ServeCluster
from kvmesh.cluster.launch.placement import ReplicaPlacement
from kvmesh.cluster.launch.ray_cluster import RayHandle
from kvmesh.router.replicas.roles import BOTH, PREFILL


def _cluster(messages: list[str]) -> ServeCluster:
    cluster = ServeCluster(from_dict({"replicas": {"num_prefill_replicas": 1}}), report=messages.append)
    st = cluster.state
    st.ray = RayHandle(owned=False, local=True, node_ip="127.0.0.1", num_gpus=0)
    st.model_path, st.device, st.served_model_name = "/models/x", "cpu", "x"
    st.engine, st.kv_transfer = cluster.engine_config(), None
    return cluster


def test_router_and_every_replica_get_the_same_internal_key_fresh_per_run(monkeypatch):
    import kvmesh.replica.actor as actor

    started = []
    monkeypatch.setattr(actor, "start_replica_actor", lambda options, **ray_options: started.append(options))
    messages: list[str] = []
    cluster = _cluster(messages)
    router = cluster.router_config("admin-key-0123")
    assert router.internal_key and router.upstream.replica_api_key is None  # the router sends replicas the internal key
    cluster.start_replica(ReplicaPlacement(0, None, None), BOTH)  # at start
    cluster.start_replica(ReplicaPlacement(1, None, None), PREFILL)  # a replica the fleet adds later
    cluster._spawn["replica-0"]()  # the supervisor replacing a dead replica-0
    assert [options.server.internal_key for options in started] == [router.internal_key] * 3
    assert all(router.internal_key not in repr(options) for options in started)
    assert router.internal_key not in repr(router) and router.internal_key not in "".join(messages)
    assert _cluster([]).router_config().internal_key != router.internal_key  # one per run
