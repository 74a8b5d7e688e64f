"""The fleet's two promises an operator relies on, checked on the real ``Fleet`` without Ray (its cluster
is a stand-in holding what the fleet reads: the config, the replica handles, the router's metric registry):
a cluster never drains to 0 replicas, and a replica name is never reused."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from kvmesh.cluster.config.trees import ServeConfig
from kvmesh.cluster.fleet.operations import Fleet
from kvmesh.cluster.launch.serve_state import ServeState
from kvmesh.cluster.launch.supervisor import ReplicaHandle
from prometheus_client import CollectorRegistry


def _fleet(*names: str) -> Fleet:
    state = ServeState(replicas=[ReplicaHandle(replica_id=name, actor=None) for name in names])
    state.router = SimpleNamespace(runtime=SimpleNamespace(metrics=SimpleNamespace(registry=CollectorRegistry())))
    return Fleet(SimpleNamespace(config=ServeConfig(), state=state))


def test_draining_the_last_replica_is_refused_and_changes_nothing():
    fleet = _fleet("replica-0")
    with pytest.raises(ValueError, match="replica-0 is this cluster's last replica.*kvmesh scale 2"):
        fleet.request_remove("replica-0")
    assert fleet.target == 1 and fleet.state()["queued"] == 0


def test_the_last_replica_not_already_leaving_stays():
    fleet = _fleet("replica-0", "replica-1")
    assert fleet.request_remove("replica-1") and fleet.target == 1
    assert fleet.request_remove("replica-1")  # asked again: the same removal, not a second one
    with pytest.raises(ValueError, match="replica-0 is this cluster's last replica"):
        fleet.request_remove("replica-0")
    assert fleet.state()["queued"] == 1


def test_a_new_replica_never_takes_the_name_of_one_the_cluster_started_with():
    fleet = _fleet("replica-0", "replica-1")
    fleet.st.replicas.pop()  # replica-1, started with the cluster, was removed
    assert fleet.new_indexes(1) == [2]
    assert fleet.new_indexes(2) == [3, 4]
