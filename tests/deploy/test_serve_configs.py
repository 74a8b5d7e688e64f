"""The serve side of deploy/: the serve configs load, the cloud one fits the GPU workers its cluster
configs keep up (by the same capacity check serve runs before placing), and every `kvmesh serve`
command the deploy docs, the README and the guides in docs/ show parses with the real CLI."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml
from kvmesh.cluster.cli import build_parser
from kvmesh.cluster.config.loader import load_config
from kvmesh.cluster.launch.capacity import NodeResources, ReplicaShape, check_capacity
from kvmesh.cluster.launch.placement import replica_bundles

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
SERVE_CONFIGS = sorted(DEPLOY.glob("serve*.yaml"))
AUTOSCALING_CLUSTERS = [DEPLOY / "aws.yaml", DEPLOY / "gcp.yaml"]
REFERENCES = {"cli.md", "configuration.md"}
"""Generated references: their flags are listed, not commands (tests/cluster/test_c*_docs.py check them)."""
DOCS = [*sorted(DEPLOY.glob("*.yaml")), DEPLOY / "README.md", DEPLOY.parent / "README.md",
        *sorted(p for p in (DEPLOY.parent / "docs").glob("*.md") if p.name not in REFERENCES)]
SERVE_COMMAND = re.compile(r"kvmesh serve((?:\s+--?[a-z][^\s\"`]*(?:\s+(?:'[^']*'|[^-\s\"'`][^\s\"'`]*))?)*)")
"""`kvmesh serve` and the flags after it (each with at most one value, a single-quoted one whole: vLLM's JSON
flags), up to a double quote or backtick."""


@pytest.mark.parametrize("path", SERVE_CONFIGS, ids=lambda p: p.name)
def test_serve_config_loads(path):
    load_config(path, env={})


def _kept_up_gpu_nodes(cluster_config: dict) -> list[NodeResources]:
    """The GPU workers a `ray up` cluster runs without scaling up (min_workers of each GPU type)."""
    nodes = []
    for name, node_type in cluster_config["available_node_types"].items():
        if node_type["resources"].get("GPU", 0):
            nodes += [NodeResources(f"{name}-{i}", f"{name}-{i}",
                                    {k: float(v) for k, v in node_type["resources"].items()})
                      for i in range(node_type.get("min_workers", 0))]
    return nodes


@pytest.mark.parametrize("cluster_path", AUTOSCALING_CLUSTERS, ids=lambda p: p.name)
def test_cloud_serve_config_fits_the_gpu_workers_and_waits_for_more(cluster_path):
    serve = load_config(DEPLOY / "serve.cloud.yaml", env={})
    assert serve.ray.address == "auto" and serve.ray.wait_for_nodes and serve.ray.placement_timeout_s >= 600
    tp = serve.engine.tensor_parallel_size
    shape = ReplicaShape(tp, serve.gpus_per_worker,
                         replica_bundles(tp, serve.replicas.num_cpus_per_worker, "cuda", serve.gpus_per_worker))
    nodes = _kept_up_gpu_nodes(yaml.safe_load(cluster_path.read_text()))
    assert check_capacity(nodes, shape, serve.replicas.num_replicas).fits


def _serve_commands(text: str) -> list[str]:
    """The arguments of every `kvmesh serve ...` command in ``text`` (backslash continuations joined)."""
    text = re.sub(r"\\\n\s*", " ", text)
    return [" ".join(m.group(1).split()) for m in SERVE_COMMAND.finditer(text)]


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(DEPLOY.parent)))
def test_serve_commands_in_the_deploy_docs_parse(path):
    parser = build_parser()
    for args in _serve_commands(path.read_text()):
        parser.parse_args(["serve", *shlex.split(args)])  # an unknown flag or bad value exits (fails the test)


def test_the_command_extraction_sees_flags():
    assert _serve_commands('x "kvmesh serve --config a.yaml \\\n  --num-replicas 1 --scale-with-load"') == [
        "--config a.yaml --num-replicas 1 --scale-with-load"]
