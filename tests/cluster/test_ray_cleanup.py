"""A Ray start that timed out leaves its processes behind; serve kills them, and only them (psutil)."""

from __future__ import annotations

import subprocess
import sys

import pytest

psutil = pytest.importorskip("psutil")

# A stand-in for the GCS/raylet: named like Ray, with a child of its own (as the raylet has workers).
FAKE_RAYLET = "import subprocess, time; subprocess.Popen(['sleep', '60']); time.sleep(60)"


# Runs in a child process of its own: the cleanup kills the *calling* process's Ray children, and the
# test session's own Ray instance must survive it.
SCENARIO = f"""
import subprocess, sys, time
import psutil
from kvmesh.cluster.launch.ray_cluster import _kill_own_ray_processes

raylet = subprocess.Popen([sys.executable, "-c", {FAKE_RAYLET!r}, "fake-raylet"])
bystander = subprocess.Popen(["sleep", "60"])
deadline = time.monotonic() + 10
while not psutil.Process(raylet.pid).children() and time.monotonic() < deadline:
    time.sleep(0.05)
(worker,) = psutil.Process(raylet.pid).children()
_kill_own_ray_processes()
raylet_gone = not psutil.pid_exists(raylet.pid)
worker_gone = not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE
bystander_alive = bystander.poll() is None
for proc in (raylet, bystander):
    proc.kill()
    proc.wait()
print(raylet_gone, worker_gone, bystander_alive)
"""


def test_kills_ray_children_and_their_descendants_but_nothing_else():
    out = subprocess.run([sys.executable, "-c", SCENARIO], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    raylet_gone, worker_gone, bystander_alive = out.stdout.split()
    assert raylet_gone == "True"  # killed and reaped (by the cleanup itself)
    assert worker_gone == "True"
    assert bystander_alive == "True"
