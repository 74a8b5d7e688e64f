"""Before placing, serve compares what the replicas need with what the nodes have (Ray's resource model:
a fractional GPU is carved out of one card, a replica's TP workers share one node) and refuses at once,
saying what is needed, what is there and what to change."""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from kvmesh.cluster.config.trees import SERVE_SCHEMA
from kvmesh.cluster.launch.capacity import (
    CapacityError,
    NodeResources,
    ReplicaShape,
    check_capacity,
    replicas_on_node,
)
from kvmesh.cluster.launch.placement import replica_bundles


def _node(address: str, gpus: float, cpus: float = 8.0) -> NodeResources:
    return NodeResources(node_id=f"id-{address}", address=address, resources={"CPU": cpus, "GPU": gpus})


def _shape(tp: int = 1, gpus_per_worker: float = 1.0, cpus: float = 1.0) -> ReplicaShape:
    return ReplicaShape(tp, gpus_per_worker, replica_bundles(tp, cpus, "cuda", gpus_per_worker))


def _refusal(nodes, shape, num_replicas, embedded=False) -> str:
    with pytest.raises(CapacityError) as info:
        check_capacity(nodes, shape, num_replicas, embedded=embedded)
    return str(info.value)


def test_three_whole_gpu_replicas_on_a_one_gpu_node_are_refused_with_what_to_do():
    message = _refusal([_node("10.0.0.1", gpus=1)], _shape(), 3)
    assert message.startswith("3 replicas x 1 GPU need 3 GPUs")
    assert "the cluster has 1 GPU" in message and "node 10.0.0.1: 1 GPU, 8 CPUs -> holds 1" in message
    assert "--num-replicas 1" in message and "--gpus-per-replica 0.33" in message and "add GPU nodes" in message


def test_three_replicas_at_a_third_of_a_gpu_share_one_card():
    plan = check_capacity([_node("10.0.0.1", gpus=1)], _shape(gpus_per_worker=0.33), 3)
    assert plan.per_node == {"id-10.0.0.1": 3}


def test_the_suggested_share_really_fits():
    nodes = [_node("10.0.0.1", gpus=1)]
    message = _refusal(nodes, _shape(), 4)
    share = float(re.search(r"--gpus-per-replica ([0-9.]+)", message).group(1))
    assert share == 0.25 and check_capacity(nodes, _shape(gpus_per_worker=share), 4).fits


def test_a_fraction_is_carved_out_of_one_card():
    two_gpus = _node("10.0.0.1", gpus=2, cpus=64)
    assert replicas_on_node(two_gpus, [{"CPU": 1.0, "GPU": 0.6}]) == 2  # 0.4 left on each card: no third
    assert replicas_on_node(two_gpus, [{"CPU": 1.0, "GPU": 0.4}]) == 4
    assert replicas_on_node(two_gpus, [{"CPU": 1.0, "GPU": 0.33}]) == 6


def test_tensor_parallel_workers_must_share_one_node():
    nodes = [_node("10.0.0.1", gpus=1), _node("10.0.0.2", gpus=1)]
    message = _refusal(nodes, _shape(tp=2), 1)
    assert "1 replica x 2 GPUs (2 workers on ONE node" in message
    assert "holds 0" in message and "--tensor-parallel-size 1" in message and "nodes with 2+ GPUs" in message
    assert "--gpus-per-replica" not in message  # TP needs whole GPUs


def test_mixed_nodes_count_what_each_can_hold():
    nodes = [_node("10.0.0.1", gpus=0), _node("10.0.0.2", gpus=2), _node("10.0.0.3", gpus=1)]
    assert check_capacity(nodes, _shape(tp=2), 1).per_node == {"id-10.0.0.1": 0, "id-10.0.0.2": 1, "id-10.0.0.3": 0}
    assert check_capacity(nodes, _shape(), 3).holds == 3
    message = _refusal(nodes, _shape(tp=2), 2)
    assert "--num-replicas 1" in message and "node 10.0.0.2: 2 GPUs, 8 CPUs -> holds 1" in message


def test_cpus_can_be_what_is_missing():
    message = _refusal([_node("10.0.0.1", gpus=4, cpus=2)], _shape(), 3)
    assert "holds 2" in message and "--num-replicas 2" in message and "--num-cpus-per-worker" in message


def test_an_embedded_ray_is_told_to_raise_num_cpus_not_to_add_nodes():
    node = NodeResources("local", "127.0.0.1", {"CPU": 3.0})
    message = _refusal([node], ReplicaShape(1, 0.0, [{"CPU": 1.0}]), 4, embedded=True)
    assert message.startswith("4 replicas x 1 CPU need 4 CPUs")
    assert "a higher --num-cpus" in message and "add nodes" not in message


def test_gpus_asked_of_a_cluster_without_any_suggest_cpu():
    message = _refusal([_node("127.0.0.1", gpus=0)], _shape(), 1, embedded=True)
    assert "the cluster has 0 GPUs" in message and "--device cpu" in message


def test_every_flag_the_advice_names_exists():
    messages = [_refusal([_node("10.0.0.1", gpus=1, cpus=2)], _shape(), 3),
                _refusal([_node("10.0.0.1", gpus=1)], _shape(tp=2), 1),
                _refusal([_node("10.0.0.1", gpus=0, cpus=1)], _shape(), 2, embedded=True),
                _refusal([NodeResources("a", "127.0.0.1", {"CPU": 1.0})], ReplicaShape(1, 0, [{"CPU": 1.0}]), 2)]
    named = {flag for m in messages for flag in re.findall(r"--[a-z][a-z-]+", m)}
    flags = {opt.flag for opt in SERVE_SCHEMA.options} | {f"--no-{opt.flag[2:]}" for opt in SERVE_SCHEMA.options}
    assert named and named <= flags, named - flags


def children_cpu_s() -> float:
    """CPU seconds of the child processes this one has waited for."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def test_kvmesh_serve_without_the_gpus_answers_in_seconds_before_starting_ray():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # Ray's own detection then finds no GPU, as here
    cpu_before = children_cpu_s()
    done = subprocess.run([str(Path(sys.executable).parent / "kvmesh"), "serve", "--device", "cuda",
                           "--num-replicas", "3", "--port", "0", "--http-port", "0", "--event-port", "0"],
                          capture_output=True, text=True, timeout=600, env=env)  # a backstop: loaded, it may crawl
    assert children_cpu_s() - cpu_before < 20  # its own CPU, whatever the load: the imports and a check, no Ray
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("kvmesh serve: 3 replicas x 1 GPU need 3 GPUs") and "Traceback" not in done.stderr
    assert "--device cpu" in done.stderr and "starting" not in done.stdout  # no Ray was started
