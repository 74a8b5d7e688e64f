"""capacity.py's model of Ray's resources against Ray itself: a separate one-node Ray (its own process,
logical GPUs) places the same bundles, and the counts must agree -- fractions carved out of one card,
TP workers together, CPUs counted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from kvmesh.cluster.launch.capacity import NodeResources, replicas_on_node
from kvmesh.cluster.launch.placement import replica_bundles

pytestmark = [pytest.mark.ray, pytest.mark.slow]

PROBE = Path(__file__).with_name("ray_capacity_probe.py")
NODE = {"CPU": 8, "GPU": 2}
SCENARIOS = {
    "0.6 GPU: one per card": [{"CPU": 1.0, "GPU": 0.6}],
    "0.4 GPU: two per card": [{"CPU": 1.0, "GPU": 0.4}],
    "0.33 GPU: three per card": [{"CPU": 1.0, "GPU": 0.33}],
    "whole GPUs": replica_bundles(1, 1.0, "cuda"),
    "TP=2 on one node": replica_bundles(2, 1.0, "cuda"),
    "CPUs run out first": replica_bundles(1, 3.0, "cuda", 0.5),
}


def test_replicas_per_node_match_what_ray_places():
    node = NodeResources("probe", "127.0.0.1", {k: float(v) for k, v in NODE.items()})
    predicted = [replicas_on_node(node, bundles) for bundles in SCENARIOS.values()]
    assert predicted == [2, 4, 6, 2, 1, 2]  # the model's answers, in the words of the scenario names
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.Popen([sys.executable, str(PROBE), json.dumps(NODE),
                             json.dumps([[b, p] for b, p in zip(SCENARIOS.values(), predicted, strict=True)])],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err[-2000:]
    placed = json.loads(out.strip().splitlines()[-1])
    assert dict(zip(SCENARIOS, placed, strict=True)) == dict(zip(SCENARIOS, predicted, strict=True))
