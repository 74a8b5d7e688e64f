"""The supervisor keeps the configured replica count: a replica whose actor dies for good is
replaced under the same id, restarts count in a sliding window, crash loops back off
(the 4th crash used to remove a replica for good)."""

from __future__ import annotations

import os
import time
from collections import deque

import pytest
from kvmesh.cluster.launch.supervisor import ReplicaHandle, Supervisor, SupervisorConfig


class RecordingRouter:
    """Stands in for RouterClient: records the registry calls."""

    def __init__(self) -> None:
        self.registered: list[tuple[str, str]] = []
        self.deregistered: list[str] = []

    def register(self, replica_id, url, events, replay, role="both"):
        self.registered.append((replica_id, url))
        return {"id": replica_id}

    def deregister(self, replica_id):
        self.deregistered.append(replica_id)
        return True


class FakeReplica:
    """A replica actor's supervision surface, without an engine."""

    def __init__(self, replica_id: str) -> None:
        self.replica_id, self.started_at = replica_id, time.time()

    def endpoints(self) -> dict:
        return {"replica_id": self.replica_id, "pid": os.getpid(), "started_at": self.started_at,
                "http_url": f"http://127.0.0.1:{os.getpid()}", "events_endpoint": None, "replay_endpoint": None}

    def crash(self) -> None:
        os._exit(1)


def test_restarts_beyond_the_window_allowance_back_off_exponentially():
    sup = Supervisor([], RecordingRouter(), config=SupervisorConfig(
        max_restarts_per_window=2, restart_window_s=60, replace_backoff_s=1, replace_backoff_max_s=5))
    handle = ReplicaHandle("r0", actor=None)
    now = time.monotonic()
    delays = []
    for _ in range(6):
        handle.restart_times.append(now)
        delays.append(sup.replace_delay(handle))
    assert delays == [0, 0, 1, 2, 4, 5]
    handle.restart_times = deque([now - 120] * 5)  # old restarts leave the window
    assert sup.recent_restarts(handle) == 0 and sup.replace_delay(handle) == 0


def test_config_rejects_nonsense():
    with pytest.raises(ValueError, match="restart_window_s"):
        SupervisorConfig(restart_window_s=0)


@pytest.mark.ray
def test_five_kills_of_one_replica_and_capacity_is_restored(ray_session):
    remote = ray_session.remote(num_cpus=0, max_restarts=0)(FakeReplica)
    router = RecordingRouter()
    handles = [ReplicaHandle(f"replica-{i}", remote.remote(f"replica-{i}")) for i in range(2)]
    config = SupervisorConfig(max_restarts_per_window=3, restart_window_s=60, replace_backoff_s=0.2,
                              replace_backoff_max_s=0.4, call_timeout_s=5)
    sup = Supervisor(handles, router, spawn=lambda rid: remote.remote(rid), config=config, report=lambda m: None)

    def settle(handle, timeout=60.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            sup.check(handle)
            if handle.up and handle.replace_at is None:
                return True
            time.sleep(0.1)
        return False

    try:
        for h in handles:
            assert settle(h)
        victim = handles[0]
        for kill in range(5):
            if kill % 2:
                ray_session.kill(victim.actor, no_restart=True)
            else:
                victim.actor.crash.remote()
            deadline = time.monotonic() + 30
            while victim.up and time.monotonic() < deadline:  # until the supervisor sees it die
                sup.check(victim)
                time.sleep(0.05)
            assert settle(victim), f"replica not replaced after kill {kill + 1}"
        assert victim.replacements == 5 and victim.restarts_seen >= 5
        assert router.deregistered == []  # never removed: capacity is kept
        assert [rid for rid, _ in router.registered].count("replica-0") == 6
        assert all(sup.check(h) is None and h.up for h in handles)
    finally:
        for h in handles:
            ray_session.kill(h.actor, no_restart=True)
