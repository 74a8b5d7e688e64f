"""kvmesh bench replica-kill, one short trial (the 10-trial run is in BENCHMARKS.md): real replicas and a
router, each its own process; one replica SIGKILLed under 16 streaming clients. No client sees a 5xx, an
error event, a broken stream or an exception's text: the router retried or migrated what the dead
replica held."""

from __future__ import annotations

import json

import pytest
from kvmesh.cluster.measure.benchmarks.replica_kill import LEAK, main

pytestmark = [pytest.mark.slow, pytest.mark.live]  # main() starts replicas and a router, each a process


def test_a_replica_killed_under_streaming_load_costs_clients_nothing(stories_path, tmp_path):
    out = tmp_path / "replica_kill.json"
    code = main(["--model", str(stories_path), "--trials", "1", "--duration", "6", "--kill-at", "2",
                 "--out", str(out)])
    result = json.loads(out.read_text())
    (trial,) = result["per_trial"]
    assert trial["requests"] >= 16 and result["status_codes"] == {"200": result["requests"]}, result
    assert result["http_5xx"] == result["streams_not_done"] == result["leaking_answers"] == 0, trial
    assert trial["retries"] + trial["migrations"] >= 1  # the kill hit requests in flight
    assert code == 0


def test_the_leak_check_finds_exception_text():
    assert LEAK.search('{"error": {"message": "internal router error: RuntimeError: unable to perform"}}')
    assert LEAK.search("unable to perform operation on <TCPTransport closed=True reading=False 0x55ff2c687c80>")
    assert not LEAK.search('{"error": {"message": "internal router error (request id 3f2a9c1b00de); its log '
                           'has the details", "type": "internal_server_error"}}')


def test_a_replica_whose_port_was_taken_before_it_bound_starts_again_on_fresh_ports(stories_path, monkeypatch):
    """Ports are picked free, then bound by the replica's process: another process can take one in between (under a
    loaded test run, a connection's local port did), and the replica exits at start. It is started again elsewhere."""
    import socket

    from kvmesh.cluster.measure.benchmarks.startup import _free_port
    from kvmesh.cluster.measure.benchmarks.support import kill_fleet
    from kvmesh.cluster.measure.benchmarks.support.json_http import call

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    picks = iter([taken.getsockname()[1]])
    monkeypatch.setattr(kill_fleet, "_free_port", lambda: next(picks, None) or _free_port())
    replica = kill_fleet.ReplicaProcess(str(stories_path), "taken")
    try:
        replica.start()
        first = replica.proc
        replica.listening(120.0)
        assert first.returncode not in (None, 0) and replica.proc is not first  # the first one could not bind
        assert replica.ports[0] != taken.getsockname()[1]
        assert call("GET", f"http://127.0.0.1:{replica.ports[0]}/health", timeout=5.0).status == 200
    finally:
        replica.kill()
        taken.close()
