"""A Ray start that timed out leaves its processes behind; serve kills them, and only them (psutil)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

psutil = pytest.importorskip("psutil")

# A stand-in for the GCS/raylet: named like Ray, with a child of its own (as the raylet has workers).
FAKE_RAYLET = "import subprocess, time; subprocess.Popen(['sleep', '60']); time.sleep(60)"


def _wait_for_children(proc: subprocess.Popen, n: int) -> list:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        children = psutil.Process(proc.pid).children()
        if len(children) >= n:
            return children
        time.sleep(0.05)
    raise AssertionError(f"process {proc.pid} did not start {n} children")


def test_kills_ray_children_and_their_descendants_but_nothing_else():
    from kvmesh.cluster.ray_cluster import _kill_own_ray_processes

    raylet = subprocess.Popen([sys.executable, "-c", FAKE_RAYLET, "fake-raylet"])
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        (worker,) = _wait_for_children(raylet, 1)
        _kill_own_ray_processes()
        # killed and reaped (by the cleanup itself: Popen sees no exit status left)
        assert not psutil.pid_exists(raylet.pid)
        assert not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE
        assert bystander.poll() is None
    finally:
        for proc in (raylet, bystander):
            proc.kill()
            proc.wait()
