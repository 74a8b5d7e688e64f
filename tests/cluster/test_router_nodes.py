"""Routers placed on Ray nodes (cluster/launch/node_routers.py): which nodes take them, the ``routers`` section and its
flags, and a placed router following the replica set board (cluster/launch/node_router.py) without Ray."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future

import pytest
from kvmesh.cluster.config.flags import ConfigError, config_from_args
from kvmesh.cluster.config.router_nodes import RouterNodesConfig
from kvmesh.cluster.config.trees import SERVE_SCHEMA, ServeConfig
from kvmesh.cluster.launch.node_router import BoardFollower
from kvmesh.cluster.launch.node_routers import router_nodes
from kvmesh.cluster.launch.replica_set_board import ReplicaSetBoard
from kvmesh.router.config import RouterConfig
from kvmesh.router.control.rows import ReplicaList, ReplicaRow
from kvmesh.router.control.runtime import RouterRuntime


def _node(node_id: str, cpus: float = 4.0, alive: bool = True, **resources: float) -> dict:
    return {"NodeID": node_id, "Alive": alive, "Resources": {"CPU": cpus, **resources}}


NODES = [_node("head", kvmesh_router=1), _node("a", kvmesh_router=1), _node("b"), _node("dead", alive=False)]


def test_every_node_gets_one_router_when_num_routers_is_minus_one():
    assert router_nodes(NODES, RouterNodesConfig(num_routers=-1), port=8000) == ["head", "a", "b"]


def test_a_router_resource_limits_the_nodes_that_take_routers():
    routers = RouterNodesConfig(num_routers=-1, router_resource="kvmesh_router")
    assert router_nodes(NODES, routers, port=8000) == ["head", "a"]


def test_routers_spread_one_per_node_in_order():
    assert router_nodes(NODES, RouterNodesConfig(num_routers=2), port=8000) == ["head", "a"]


def test_a_fixed_port_refuses_more_routers_than_nodes():
    with pytest.raises(ValueError, match="num_routers=4 but 3 node"):
        router_nodes(NODES, RouterNodesConfig(num_routers=4), port=8000)


def test_an_ephemeral_port_lets_routers_share_nodes():
    assert router_nodes(NODES, RouterNodesConfig(num_routers=4), port=0) == ["head", "a", "b", "head"]


def test_no_node_with_the_resource_is_a_clear_error():
    with pytest.raises(ValueError, match="no Ray node offers resource 'gpu_router'"):
        router_nodes(NODES, RouterNodesConfig(num_routers=1, router_resource="gpu_router"), port=8000)


def test_nodes_without_the_routers_cpus_are_passed_over():
    assert router_nodes([_node("small", cpus=0.5), _node("big")], RouterNodesConfig(num_routers=-1), 80) == ["big"]


@pytest.mark.parametrize(("fields", "message"), [
    ({"num_routers": -2}, "routers.num_routers=-2"),
    ({"router_resource": "no spaces"}, "not a Ray resource name"),
    ({"router_cpus": -1.0}, "router_cpus=-1.0"),
    ({"router_restarts": -3}, "router_restarts=-3"),
    ({"router_ready_timeout_s": 0.0}, "router_ready_timeout_s=0.0"),
])
def test_bad_routers_settings_name_the_field(fields, message):
    with pytest.raises(ValueError, match=message):
        RouterNodesConfig(**fields)


def test_placed_routers_are_one_process_each():
    with pytest.raises(ValueError, match="a placed router is one process"):
        ServeConfig(router=RouterConfig(host="auto", workers=2), routers=RouterNodesConfig(num_routers=2))


def test_the_routers_flags_are_derived_from_the_section():
    import argparse

    parser = argparse.ArgumentParser()
    from kvmesh.cluster.config.flags import add_config_arguments

    add_config_arguments(parser, SERVE_SCHEMA)
    args = parser.parse_args(["--num-routers", "-1", "--router-resource", "kvmesh_router", "--router-cpus", "0.5"])
    routers = config_from_args(args, SERVE_SCHEMA).routers
    assert routers == RouterNodesConfig(num_routers=-1, router_resource="kvmesh_router", router_cpus=0.5)
    with pytest.raises(ConfigError, match="num_routers"):
        config_from_args(parser.parse_args(["--num-routers", "-5"]), SERVE_SCHEMA)


class _Board:
    """The board actor's ``read`` as a Ray handle offers it (``read.remote().future()``)."""

    def __init__(self, rows: list[ReplicaRow] | None, error: Exception | None = None) -> None:
        self.raw = ReplicaList(rows).encode() if rows is not None else None
        self.error = error
        self.read = self

    def remote(self) -> _Board:
        return self

    def future(self) -> Future:
        done: Future = Future()
        if self.error is not None:
            done.set_exception(self.error)
        else:
            done.set_result(self.raw)
        return done


class _Server:
    def __init__(self, runtime: RouterRuntime) -> None:
        self.runtime = runtime


def _row(replica_id: str, draining: bool = False) -> ReplicaRow:
    return ReplicaRow(id=replica_id, url=f"http://127.0.0.1:9/{replica_id}", role="both", events=None, replay=None,
                      events_source="none",
                      healthy=True, draining=draining, degraded=None, in_flight=0, prefill_backlog=0)


def _follow(runtime: RouterRuntime, board: _Board) -> None:
    asyncio.run(BoardFollower(_Server(runtime), board, "router-0").follow_once())


def test_a_placed_router_makes_its_replica_set_the_boards():
    runtime = RouterRuntime(RouterConfig())
    _follow(runtime, _Board([_row("replica-0"), _row("replica-1", draining=True)]))
    assert {r.id for r in runtime.replicas} == {"replica-0", "replica-1"} and runtime.draining == {"replica-1"}
    _follow(runtime, _Board([_row("replica-1")]))
    assert {r.id for r in runtime.replicas} == {"replica-1"} and not runtime.draining


def test_the_board_introduces_the_placed_routers_sync_endpoints_and_a_restart_replaces_one():
    board = ReplicaSetBoard()
    assert board.sync_peers("router-0", "tcp://10.0.0.1:41000") == []
    assert board.sync_peers("router-1", "tcp://10.0.0.2:42000") == ["tcp://10.0.0.1:41000"]
    assert board.sync_peers("router-0", "tcp://10.0.0.1:41999") == ["tcp://10.0.0.2:42000"]  # restarted by Ray
    assert board.sync_peers("router-1", "tcp://10.0.0.2:42000") == ["tcp://10.0.0.1:41999"]
    assert board.sync_peers("router-1", None) == ["tcp://10.0.0.1:41999"]  # sync off there: it publishes nothing
    assert board.sync_peers("router-0", "tcp://10.0.0.1:41999") == []


def test_a_board_that_restarted_or_cannot_be_reached_leaves_the_set_as_it_is():
    runtime = RouterRuntime(RouterConfig())
    _follow(runtime, _Board([_row("replica-0")]))
    _follow(runtime, _Board(None))  # restarted, nothing published yet
    _follow(runtime, _Board([], error=ConnectionError("actor restarting")))
    assert {r.id for r in runtime.replicas} == {"replica-0"}


class _Owner:
    """The owner's ``GET /replicas`` for one draining replica: this host's in-flight count and the replica's own."""

    def __init__(self, in_flight: list[int], running: list[int]) -> None:
        self.rows = [{"id": "replica-0", "in_flight": f, **({"running": r} if r else {})}
                     for f, r in zip(in_flight, running, strict=True)]

    def replicas(self) -> list[dict]:
        return [self.rows.pop(0) if len(self.rows) > 1 else self.rows[0]]


def test_a_drain_without_placed_routers_waits_for_this_hosts_requests_only():
    from kvmesh.cluster.fleet.replica_remove import wait_drained

    assert wait_drained(_Owner([1, 0], [3, 3]), "replica-0", timeout_s=5.0) == 0


def test_a_drain_with_placed_routers_waits_for_the_replicas_own_running_requests():
    from kvmesh.cluster.fleet.replica_remove import wait_drained

    owner = _Owner([0, 0, 0], [2, 1, 0])
    assert wait_drained(owner, "replica-0", timeout_s=5.0, settle_s=0.01) == 0
    assert wait_drained(_Owner([0], [2]), "replica-0", timeout_s=0.3, settle_s=0.01) == 2


def test_a_replicas_row_carries_its_own_count_of_running_requests():
    from kvmesh.router.control.rows import replica_row

    runtime = RouterRuntime(RouterConfig())
    _follow(runtime, _Board([_row("replica-0")]))
    replica = runtime.router.replicas.get("replica-0")
    replica.load.num_running, replica.load.num_waiting = 3, 2
    assert replica_row(replica, 0.0).running == 5


def test_one_machines_address_is_refused_for_routers_on_several_nodes():
    with pytest.raises(ValueError, match=r"router.host=10.0.0.5 is one machine's address"):
        router_nodes(NODES, RouterNodesConfig(num_routers=2), port=8000, host="10.0.0.5")
    assert router_nodes(NODES, RouterNodesConfig(num_routers=1), port=8000, host="10.0.0.5") == ["head"]
    assert router_nodes(NODES, RouterNodesConfig(num_routers=2), port=8000, host="127.0.0.1") == ["head", "a"]


def test_the_autoscaler_counts_what_routers_on_other_hosts_sent_a_replica():
    from kvmesh.cluster.config.autoscale import AutoscaleConfig
    from kvmesh.cluster.fleet.autoscaler import desired_replicas

    config = AutoscaleConfig(scale_with_load=True, min_replicas=1, max_replicas=8, target_in_flight=4)
    rows = [{"id": "replica-0", "in_flight": 0, "running": 12}, {"id": "replica-1", "in_flight": 2}]
    assert desired_replicas(config, rows)[0] == 4  # (12 + 2) / 4, rounded up


def test_an_embedded_ray_counts_the_placed_routers_cpus():
    from kvmesh.cluster.launch.ray_cluster import embedded_num_cpus

    alone = embedded_num_cpus(ServeConfig())
    assert embedded_num_cpus(ServeConfig(routers=RouterNodesConfig(num_routers=-1))) == alone + 1
    assert embedded_num_cpus(ServeConfig(routers=RouterNodesConfig(num_routers=2, router_cpus=0.5))) == alone + 1
