"""deploy/*.yaml are valid `ray up` cluster configs by Ray's own validation (no cloud contacted)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
CLUSTER_CONFIGS = sorted(p for p in DEPLOY.glob("*.yaml") if not p.name.startswith(("serve", "kuberay")))
"""The `ray up` configs: not the serve configs, nor KubeRay's manifest (tests/deploy/test_kuberay.py)."""


def _validate(config: dict) -> dict:
    """Ray's `ray up` path: fill in the provider's defaults, then check against ray-schema.json."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    return prepared


def test_there_are_aws_gcp_and_onprem_configs():
    providers = {yaml.safe_load(p.read_text())["provider"]["type"] for p in CLUSTER_CONFIGS}
    assert providers == {"aws", "gcp", "local"}


@pytest.mark.parametrize("path", CLUSTER_CONFIGS, ids=lambda p: p.name)
def test_cluster_config_passes_ray_validation(path):
    _validate(yaml.safe_load(path.read_text()))


@pytest.mark.parametrize("path", CLUSTER_CONFIGS, ids=lambda p: p.name)
def test_nodes_install_kvmesh_and_the_ray_version_in_use(path):
    import ray

    config = yaml.safe_load(path.read_text())
    setup = "\n".join(config["setup_commands"])
    assert f"ray[default]=={ray.__version__}" in setup
    assert "kvmesh[gpu]" in setup  # the gpu extra on GPU nodes


@pytest.mark.parametrize("path", [p for p in CLUSTER_CONFIGS if
                                  yaml.safe_load(p.read_text())["provider"]["type"] != "local"],
                         ids=lambda p: p.name)
def test_cloud_configs_have_a_cpu_head_and_gpu_workers(path):
    config = yaml.safe_load(path.read_text())
    types = config["available_node_types"]
    assert types[config["head_node_type"]]["resources"].get("GPU", 0) == 0  # the router's node
    workers = [t for name, t in types.items() if name != config["head_node_type"]]
    assert workers and all(t["resources"].get("GPU", 0) >= 1 for t in workers)
    assert sum(t.get("min_workers", 0) for t in workers) >= 2  # one replica per node by default


def test_validation_rejects_a_misspelled_key():
    config = yaml.safe_load((DEPLOY / "aws.yaml").read_text())
    config["max_worker"] = config.pop("max_workers")
    with pytest.raises(Exception, match="max_worker"):
        _validate(config)


def test_validation_rejects_a_bad_value():
    config = yaml.safe_load((DEPLOY / "gcp.yaml").read_text())
    config["available_node_types"]["gpu_worker"]["min_workers"] = "two"
    with pytest.raises(Exception, match="two"):
        _validate(config)


def test_example_serve_config_is_a_valid_serve_config():
    from kvmesh.cluster.config.loader import load_config

    config = load_config(DEPLOY / "serve.example.yaml", env={})
    assert config.router.host == "auto"  # loopback locally, the node's IP in a cluster; never 0.0.0.0
