"""kvmesh's embedded Ray listens on loopback only and no Ray process holds kvmesh's secrets.

A fresh process (the session's Ray would not tell) starts the embedded Ray exactly as ``kvmesh serve``
does, with the secrets in its environment, runs one actor, and reports every listening socket of its
process tree (``ss -ltnp``) and which of its processes' environments hold a secret.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]

SECRETS = {"KVMESH_API_KEY": "tenant-key-123456", "KVMESH_HASH_SEED": "hash-seed-123456",
           "KVMESH_ADMIN_KEY": "admin-key-123456", "KVMESH_INTERNAL_KEY": "internal-key-123456"}

PROBE = r"""
import json, os, re, subprocess, time
import ray
from kvmesh.cluster.launch import ray_cluster
from kvmesh.cluster.config.trees import ServeConfig

handle = ray_cluster.connect(ServeConfig())

@ray.remote(num_cpus=0)
class Probe:
    def env(self):
        return sorted(k for k in os.environ if k.startswith("KVMESH_"))

actor = Probe.remote()
actor_env = ray.get(actor.env.remote())

def process_tree():
    children = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                children.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
        except (OSError, IndexError, ValueError):
            pass
    tree, stack = set(), [os.getpid()]
    while stack:
        pid = stack.pop()
        tree.add(pid)
        stack += children.get(pid, [])
    return tree

def tree_listeners(tree):
    listeners = []
    for line in subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout.splitlines():
        pids = {int(p) for p in re.findall(r"pid=(\d+)", line)}
        if pids & tree:
            listeners.append(line.split()[3])
    return listeners

# agents open their ports a moment after start: until every port the node's record names listens
node = ray.nodes()[0]
named = {k: v for k, v in node.items() if k.endswith("Port") and isinstance(v, int) and v > 0}
deadline = time.monotonic() + 60
while True:
    tree = process_tree()
    listeners = tree_listeners(tree)
    missing = {k: v for k, v in named.items() if v not in {int(a.rsplit(":", 1)[1]) for a in listeners}}
    if not missing:
        break
    if time.monotonic() > deadline:
        raise SystemExit(f"Ray's ports {missing} not listening after 60 s; listening: {listeners}")
    time.sleep(0.1)
leaky = []
for pid in tree - {os.getpid()}:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read()
    except OSError:
        continue
    if any(name.encode() + b"=" in env for name in %(names)r):
        leaky.append(pid)
print(json.dumps({"listeners": listeners, "actor_env": actor_env, "leaky": leaky,
                  "node_ip": handle.node_ip, "tree": len(tree)}))
ray_cluster.disconnect(handle)
"""


@pytest.fixture(scope="module")
def probe() -> dict:
    if shutil.which("ss") is None:
        pytest.skip("needs ss (iproute2) to list listening sockets")
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith(("RAY_", "KVMESH_"))}
    out = subprocess.run([sys.executable, "-c", PROBE % {"names": sorted(SECRETS)}], env={**env, **SECRETS},
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _host(address: str) -> str:
    host = address.rsplit(":", 1)[0].strip("[]")
    return host.removeprefix("::ffff:")


def test_embedded_ray_listens_on_loopback_only(probe):
    assert probe["node_ip"] == "127.0.0.1"
    assert len(probe["listeners"]) >= 5, probe  # GCS, raylet, workers, agents: the probe saw them
    wide = [a for a in probe["listeners"] if _host(a) != "127.0.0.1"]
    assert not wide, f"Ray sockets beyond loopback: {wide}"


def test_no_ray_process_inherits_the_secrets(probe):
    assert probe["actor_env"] == []
    assert probe["leaky"] == [], f"{len(probe['leaky'])} of {probe['tree']} processes hold a secret"
