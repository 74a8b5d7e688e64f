"""Several models from one serve config (the ``deployments`` section) and placement planned for all of them."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from kvmesh.cluster.config.deployments import Deployment, deployment_config
from kvmesh.cluster.config.flags import add_config_arguments, config_from_args
from kvmesh.cluster.config.loader import ConfigError, load_config
from kvmesh.cluster.config.trees import SERVE_SCHEMA
from kvmesh.cluster.launch.capacity import CapacityError, NodeResources, ReplicaShape
from kvmesh.cluster.launch.deployment_capacity import DeploymentDemand, check_deployments_capacity
from kvmesh.cluster.launch.placement import replica_bundles

YAML = """\
engine: {model: embedded, max_num_seqs: 16}
replicas: {num_replicas: 3}
deployments:
  models:
    - {model: /models/llama, served_model_name: llama, num_replicas: 2, tensor_parallel_size: 2,
       gpus_per_replica: 2, engine: {max_num_seqs: 64}}
    - {model: embedded, served_model_name: tiny}
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "serve.yaml"
    path.write_text(text)
    return path


def test_a_config_file_lists_deployments_each_a_one_model_cluster_of_its_own(tmp_path):
    config = load_config(_write(tmp_path, YAML), env={})
    llama, tiny = config.deployments.models
    assert llama == Deployment("/models/llama", "llama", 2, 2, 2.0, engine={"max_num_seqs": 64})
    assert tiny.name == "tiny" and tiny.num_replicas == 1
    one = deployment_config(config, llama)  # the engine section with the deployment's own fields on top
    assert (one.engine.model, one.engine.tensor_parallel_size, one.engine.max_num_seqs) == ("/models/llama", 2, 64)
    assert (one.replicas.num_replicas, one.replicas.gpus_per_replica, one.router.served_model_name) == (2, 2.0, "llama")
    assert not one.deployments.models
    other = deployment_config(config, tiny)
    assert other.engine.max_num_seqs == 16 and other.engine.model == "embedded"  # the engine section's own
    assert config.deployments.named("tiny") is tiny
    with pytest.raises(ValueError, match="no deployment 'x'; the deployments: llama, tiny"):
        config.deployments.named("x")


def test_flags_add_deployments_and_a_config_without_them_is_the_one_model_as_before():
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_config_arguments(parser, SERVE_SCHEMA)
    args = parser.parse_args(["--deployment", "{model: embedded, served_model_name: a}",
                              "--deployment", "{model: embedded, served_model_name: b, num_replicas: 2}"])
    config = config_from_args(args, SERVE_SCHEMA, env={})
    assert [(d.name, d.num_replicas) for d in config.deployments.models] == [("a", 1), ("b", 2)]
    plain = load_config(env={})
    assert plain.deployments.models == [] and plain.engine.model == "embedded"


@pytest.mark.parametrize(("models", "message"), [
    ("[{model: embedded}, {model: embedded}]", "embedded named twice"),
    ("[{model: a, adapters: {a: /x}}]", "adapter name(s) a used twice"),
    ("[{model: a, engine: {model: b}}]", "set model through the deployment's own fields"),
    ("[{model: a, engine: {no_such: 1}}]", "engine.no_such is no engine setting"),
    ("[{model: a, engine: {max_num_seqs: 0}}]", "deployment a: max_num_seqs must be a positive integer"),
    ("[{model: a, num_replicas: 0}]", "num_replicas=0"),
    ("[{served_model_name: a}]", "model"),
])
def test_bad_deployments_are_refused_with_what_to_change(tmp_path, models, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(_write(tmp_path, f"deployments: {{models: {models}}}\n"), env={})


def _node(address: str, gpus: float, cpus: float = 16.0) -> NodeResources:
    return NodeResources(node_id=f"id-{address}", address=address, resources={"CPU": cpus, "GPU": gpus})


def _demand(name: str, n: int, tp: int = 1, gpus: float = 1.0) -> DeploymentDemand:
    return DeploymentDemand(name, ReplicaShape(tp, gpus / tp, replica_bundles(tp, 1.0, "cuda", gpus / tp)), n)


def test_placement_is_planned_for_every_deployment_together():
    nodes = [_node("10.0.0.1", 4), _node("10.0.0.2", 2)]
    plan = check_deployments_capacity(nodes, [_demand("small", 2, gpus=0.5), _demand("big", 1, tp=4, gpus=4),
                                              _demand("mid", 1, tp=2, gpus=1)])
    # the largest first: big takes node 1 whole, mid and both halves of small share node 2
    assert plan == {"small": ["id-10.0.0.2"] * 2, "big": ["id-10.0.0.1"], "mid": ["id-10.0.0.2"]}
    # each alone fits the 6 GPUs; together (1 + 4 + 2) they do not: refused before anything starts
    with pytest.raises(CapacityError) as e:
        check_deployments_capacity(nodes, [_demand("small", 2, gpus=0.5), _demand("big", 1, tp=4, gpus=4),
                                           _demand("mid", 1, tp=2, gpus=2)])
    text = str(e.value)
    assert "the deployments need 7 GPUs and 10 CPUs in all" in text
    assert "small: 2 replicas x 0.5 GPUs and 1 CPU (room for 0)" in text and "big: 1 replica x 4 GPUs" in text
    assert "node 10.0.0.1: 4 GPUs, 16 CPUs; node 10.0.0.2: 2 GPUs, 16 CPUs" in text
    assert "Lower a deployment's num_replicas or gpus_per_replica" in text


def test_serve_checks_every_deployments_model_and_sizes_its_embedded_ray_for_all(tmp_path):
    from kvmesh.cluster.launch.preflight import PreflightError, check
    from kvmesh.cluster.launch.ray_cluster import DRIVER_CPUS, embedded_num_cpus

    config = load_config(_write(tmp_path, "router: {port: 0}\nreplicas: {http_port: 0, event_port: 0}\n"
                                          "deployments: {models: [{model: embedded, served_model_name: a, "
                                          "num_replicas: 2}, {model: embedded, served_model_name: b, "
                                          "tensor_parallel_size: 2}]}\n"), env={})
    assert embedded_num_cpus(config) == 2 * 1 + 1 * (2 + 1) + DRIVER_CPUS  # 2 + TP 2 and its actor's CPU
    check(config)
    missing = tmp_path / "no-such-model"
    bad = load_config(_write(tmp_path, f"deployments: {{models: [{{model: embedded, served_model_name: a}}, "
                                       f"{{model: {missing}, served_model_name: b}}]}}\n"), env={})
    with pytest.raises(PreflightError, match="deployment b: "):
        check(bad)
    with pytest.raises(ConfigError, match="same engine.block_size"):
        load_config(_write(tmp_path, "deployments: {models: [{model: embedded, served_model_name: a}, "
                                     "{model: embedded, served_model_name: b, engine: {block_size: 32}}]}\n"), env={})
