"""deploy/kuberay.yaml is a well-formed ``ray.io/v1`` RayCluster whose settings are the `ray up` configs' and
what `kvmesh serve --config deploy/serve.kuberay.yaml` needs: Ray's version, the head's ports and resources, GPU
workers enough for the serve config's replicas, the router's key from a Secret.

What is checked is the manifest's structure and these settings, read from the other deploy files; it is not
validated against KubeRay's CRD schema (that needs the operator's CRD and a cluster, neither here)."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml
from kvmesh.cluster.config.loader import load_config
from kvmesh.cluster.launch.capacity import NodeResources, ReplicaShape, check_capacity
from kvmesh.cluster.launch.placement import replica_bundles

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
MANIFEST = DEPLOY / "kuberay.yaml"
RAY_UP = DEPLOY / "aws.yaml"
"""The `ray up` config the manifest mirrors (a CPU head, GPU workers kept up)."""
KEY = "k" * 16


def _ray_up_settings() -> dict:
    """Ray's pinned version, the head's GCS port, dashboard host and CPUs, from deploy/aws.yaml."""
    config = yaml.safe_load(RAY_UP.read_text())
    head_start = " ".join(config["head_start_ray_commands"])
    return {"version": re.search(r"ray\[default\]==([\w.]+)", " ".join(config["setup_commands"])).group(1),
            "port": int(re.search(r"--port=(\d+)", head_start).group(1)),
            "dashboard_host": re.search(r"--dashboard-host=(\S+)", head_start).group(1),
            "head_cpus": config["available_node_types"][config["head_node_type"]]["resources"]["CPU"]}


def _containers(group: dict) -> list[dict]:
    return group.get("template", {}).get("spec", {}).get("containers") or []


def _group_shape(group: dict, where: str) -> list[str]:
    """A head or worker group's required parts: string rayStartParams, containers with a name and an image."""
    problems = []
    params = group.get("rayStartParams")
    if not isinstance(params, dict) or not all(isinstance(v, str) for v in params.values()):
        problems.append(f"{where}: rayStartParams must be a map of strings")
    if not _containers(group):
        problems.append(f"{where}: template.spec.containers is empty")
    problems += [f"{where}: a container without a name or an image"
                 for c in _containers(group) if not c.get("name") or not c.get("image")]
    return problems


def _head_problems(head: dict, ray_up: dict, serve) -> list[str]:
    problems = _group_shape(head, "head")
    params, container = head.get("rayStartParams") or {}, (_containers(head) or [{}])[0]
    if params.get("num-gpus") != "0":
        problems.append("head: num-gpus must be \"0\" (replicas stay off the head, as in the ray up config)")
    if params.get("dashboard-host") != ray_up["dashboard_host"]:
        problems.append(f"head: dashboard-host must be {ray_up['dashboard_host']} as in the ray up config")
    if params.get("num-cpus") != str(ray_up["head_cpus"]):
        problems.append(f"head: num-cpus must be the ray up head's {ray_up['head_cpus']} CPUs")
    ports = {p.get("containerPort") for p in container.get("ports", [])}
    problems += [f"head: containerPort {port} missing" for port in (ray_up["port"], serve.router.port)
                 if port not in ports]
    keys = [e for e in container.get("env", []) if e.get("name") == "KVMESH_API_KEY"]
    if not keys or "secretKeyRef" not in keys[0].get("valueFrom", {}):
        problems.append("head: KVMESH_API_KEY must come from a Secret (the router listens on the pod's address)")
    return problems


def _worker_problems(group: dict) -> list[str]:
    name = group.get("groupName") or "a worker group"
    problems = _group_shape(group, name)
    if not group.get("minReplicas", 0) <= group.get("replicas", 0) <= group.get("maxReplicas", 0):
        problems.append(f"{name}: needs minReplicas <= replicas <= maxReplicas")
    if (group.get("rayStartParams") or {}).get("num-gpus") == "0":
        problems.append(f"{name}: num-gpus \"0\" hides the GPU from Ray")
    for c in _containers(group):
        res = c.get("resources", {})
        gpus = res.get("limits", {}).get("nvidia.com/gpu")
        if gpus is None or float(gpus) < 1 or res.get("requests", {}).get("nvidia.com/gpu", gpus) != gpus:
            problems.append(f"{name}: container {c.get('name')} needs nvidia.com/gpu >= 1, requests = limits")
        if "/dev/shm" not in {m.get("mountPath") for m in c.get("volumeMounts", [])}:
            problems.append(f"{name}: container {c.get('name')} needs /dev/shm mounted (Ray's object store)")
    return problems


def manifest_problems(manifest: dict, ray_up: dict, serve) -> list[str]:
    """Everything wrong with ``manifest`` as a RayCluster for ``serve`` on the cluster ``ray_up`` describes."""
    problems = []
    if manifest.get("apiVersion") != "ray.io/v1" or manifest.get("kind") != "RayCluster":
        problems.append("apiVersion/kind must be ray.io/v1 RayCluster")
    if not (manifest.get("metadata") or {}).get("name"):
        problems.append("metadata.name missing")
    spec = manifest.get("spec") or {}
    if spec.get("rayVersion") != ray_up["version"]:
        problems.append(f"rayVersion must be the ray up configs' {ray_up['version']}")
    problems += _head_problems(spec.get("headGroupSpec") or {}, ray_up, serve)
    workers = spec.get("workerGroupSpecs") or []
    names = [w.get("groupName") for w in workers]
    if not workers or len(set(names)) != len(names) or not all(names):
        problems.append("workerGroupSpecs: one or more groups, each with its own groupName")
    for group in workers:
        problems += _worker_problems(group)
    images = {c.get("image") for g in [spec.get("headGroupSpec") or {}, *workers] for c in _containers(g)}
    if len(images) > 1:
        problems.append(f"head and workers must run one image, not {sorted(images)}")
    return problems


@pytest.fixture(scope="module")
def setting():
    return (yaml.safe_load(MANIFEST.read_text()), _ray_up_settings(),
            load_config(DEPLOY / "serve.kuberay.yaml", env={"KVMESH_API_KEY": KEY}))


def test_the_manifest_is_a_raycluster_with_the_ray_up_settings(setting):
    assert manifest_problems(*setting) == []


def test_ray_versions_agree_everywhere(setting):
    import ray

    manifest, ray_up, _ = setting
    assert manifest["spec"]["rayVersion"] == ray_up["version"] == ray.__version__
    base = re.search(r"^FROM (\S+)", (DEPLOY / "kuberay.Dockerfile").read_text(), re.M).group(1)
    assert base.startswith(f"rayproject/ray:{ray_up['version']}-") and base.endswith("-gpu")


def test_the_serve_config_joins_the_cluster_and_takes_its_key_from_the_secret(setting):
    _, _, serve = setting
    assert serve.ray.address == "auto" and serve.router.host == "0.0.0.0" and serve.router.api_key == KEY
    assert load_config(DEPLOY / "serve.kuberay.yaml", env={}).router.api_key is None  # nothing baked in


def test_the_gpu_workers_kept_up_hold_the_serve_configs_replicas(setting):
    manifest, _, serve = setting
    nodes = []
    for group in manifest["spec"]["workerGroupSpecs"]:
        limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
        resources = {"CPU": float(limits["cpu"]), "GPU": float(limits["nvidia.com/gpu"])}
        nodes += [NodeResources(f"{group['groupName']}-{i}", f"{group['groupName']}-{i}", resources)
                  for i in range(group["minReplicas"])]
    tp = serve.engine.tensor_parallel_size
    shape = ReplicaShape(tp, serve.gpus_per_worker,
                         replica_bundles(tp, serve.replicas.num_cpus_per_worker, "cuda", serve.gpus_per_worker))
    assert check_capacity(nodes, shape, serve.replicas.num_replicas).fits


def _set(manifest: dict, path: str, value) -> dict:
    """A copy of ``manifest`` with the dotted ``path`` (list indices as numbers) set to ``value``."""
    changed = copy.deepcopy(manifest)
    *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
    node = changed
    for part in parents:
        node = node[part]
    node[last] = value
    return changed


HEAD = "spec.headGroupSpec"
WORKER = "spec.workerGroupSpecs.0"
BROKEN = {
    "apiVersion": ("apiVersion", "ray.io/v1alpha1"),
    "rayVersion": ("spec.rayVersion", "2.9.0"),
    "num-gpus": (f"{HEAD}.rayStartParams.num-gpus", "1"),
    "dashboard-host": (f"{HEAD}.rayStartParams.dashboard-host", "0.0.0.0"),
    "containerPort 8000": (f"{HEAD}.template.spec.containers.0.ports", [{"containerPort": 6379}]),
    "KVMESH_API_KEY": (f"{HEAD}.template.spec.containers.0.env", [{"name": "KVMESH_API_KEY", "value": "x" * 16}]),
    "map of strings": (f"{HEAD}.rayStartParams.num-cpus", 8),
    "nvidia.com/gpu": (f"{WORKER}.template.spec.containers.0.resources.limits", {"cpu": "4"}),
    "/dev/shm": (f"{WORKER}.template.spec.containers.0.volumeMounts", []),
    "minReplicas <= replicas": (f"{WORKER}.maxReplicas", 1),
    "one image": (f"{WORKER}.template.spec.containers.0.image", "other:latest"),
    "containers is empty": (f"{WORKER}.template.spec.containers", []),
}


@pytest.mark.parametrize("expected", BROKEN)
def test_a_manifest_that_drifts_from_the_settings_is_named(setting, expected):
    manifest, ray_up, serve = setting
    path, value = BROKEN[expected]
    problems = manifest_problems(_set(manifest, path, value), ray_up, serve)
    assert any(expected in p for p in problems), problems
