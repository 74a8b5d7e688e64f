"""Placement planning: a replica's workers on one node, replicas round-robin over nodes with room."""

from __future__ import annotations

from kvmesh.cluster.launch.placement import actor_bundle_index, plan_nodes, replica_bundles


def _node(node_id: str, cpu: float, gpu: float = 0.0, alive: bool = True) -> dict:
    return {"NodeID": node_id, "Alive": alive, "Resources": {"CPU": cpu, "GPU": gpu}}


def test_tp1_replica_is_one_bundle_holding_the_actor():
    assert replica_bundles(1, 1.0, "cpu") == [{"CPU": 1.0}]
    assert actor_bundle_index(1) == 0


def test_tp_replica_has_a_bundle_per_rank_plus_one_for_the_actor():
    bundles = replica_bundles(2, 2.0, "cuda")
    assert bundles == [{"CPU": 2.0, "GPU": 1.0}, {"CPU": 2.0, "GPU": 1.0}, {"CPU": 1.0}]
    assert actor_bundle_index(2) == 2  # ranks keep bundles 0..tp-1


def test_spread_puts_replicas_on_different_nodes():
    nodes = [_node("a", 4), _node("b", 4)]
    assert plan_nodes(nodes, [{"CPU": 1.0}], 2, "spread") == ["a", "b"]


def test_spread_wraps_around_when_there_are_more_replicas_than_nodes():
    nodes = [_node("a", 4), _node("b", 4)]
    assert plan_nodes(nodes, [{"CPU": 1.0}], 4, "spread") == ["a", "b", "a", "b"]


def test_nodes_without_room_for_a_whole_replica_are_skipped():
    head = _node("a-head", 8, gpu=0)  # the router's node: no GPU
    workers = [_node("b", 8, gpu=2), _node("c", 8, gpu=2)]
    bundles = replica_bundles(2, 1.0, "cuda")
    assert plan_nodes([head, *workers], bundles, 2, "spread") == ["b", "c"]


def test_capacity_is_used_up_as_replicas_are_planned():
    nodes = [_node("a", 2), _node("b", 1)]
    assert plan_nodes(nodes, [{"CPU": 1.0}], 3, "spread") == ["a", "b", "a"]
    assert plan_nodes(nodes, [{"CPU": 1.0}], 4, "spread")[3] is None  # nothing fits: Ray decides


def test_dead_nodes_are_ignored_and_pack_leaves_it_to_ray():
    nodes = [_node("a", 4, alive=False), _node("b", 4)]
    assert plan_nodes(nodes, [{"CPU": 1.0}], 2, "spread") == ["b", "b"]
    assert plan_nodes(nodes, [{"CPU": 1.0}], 2, "pack") == [None, None]
