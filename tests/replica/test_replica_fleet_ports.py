"""``kvmesh replica --num-replicas N``: N replicas from one process, each on its own ports counted up."""

from __future__ import annotations

import httpx
import pytest
from kvmesh.cluster.commands import replica as replica_command
from kvmesh.replica.server.config import ReplicaServerConfig


def test_replica_i_gets_ports_counted_up_from_the_first():
    server = ReplicaServerConfig(port=8100, event_port=5557, replay_port=5558, num_replicas=3)
    third = server.nth(2)
    assert (third.port, third.event_port, third.replay_port, third.num_replicas) == (8102, 5561, 5562, 1)


def test_free_ports_stay_free_ports():
    nth = ReplicaServerConfig(port=0, event_port=0, replay_port=0, num_replicas=4).nth(3)
    assert (nth.port, nth.event_port, nth.replay_port) == (0, 0, 0)


@pytest.mark.parametrize("fields, says", [
    ({"num_replicas": 0}, "positive integer"),
    ({"num_replicas": 40_000}, "past 65535"),
    ({"num_replicas": 2, "events_endpoint": "connect://tcp://collector:5557"}, "drop events_endpoint"),
])
def test_a_fleet_that_cannot_be_laid_out_is_refused(fields, says):
    with pytest.raises(ValueError, match=says):
        ReplicaServerConfig(**fields)


@pytest.mark.live
def test_one_process_serves_every_replica_of_the_fleet(stories_path):
    from kvmesh.cluster.cli import build_parser

    argv = ["replica", "--model", str(stories_path), "--emulate", "h100-8b", "--num-replicas", "3", "--port", "0",
            "--event-port", "0", "--replay-port", "0", "--kv-cache-memory", "256MiB"]
    runtimes = replica_command.start_all(replica_command.load(build_parser().parse_args(argv)))
    try:
        urls = {r.http.url for r in runtimes}
        assert len(urls) == 3 and len({r.endpoints()["events_endpoint"] for r in runtimes}) == 3
        assert [r.replica_id for r in runtimes] == ["replica-0", "replica-1", "replica-2"]
        for url in urls:
            assert httpx.get(f"{url}/load").json()["emulation"]["profile"] == "h100-8b"
    finally:
        for r in runtimes:
            r.shutdown(graceful_s=0)



def test_a_port_taken_between_its_check_and_its_bind_is_an_address_error_the_command_names():
    """``kvmesh replica`` checks its ports free when it reads its config; another process can take one while the model
    loads. uvicorn then exits its serving task (SystemExit): the server says which address, as an ``OSError`` the
    command prints in one line (``kvmesh replica: cannot start: ...``), not a traceback."""
    import socket

    from kvmesh.replica.openai.runner import HTTPServer

    async def app(scope, receive, send):  # never called
        raise AssertionError(scope)

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        with pytest.raises(OSError, match=f"could not listen on 127.0.0.1:{port}"):
            HTTPServer(app, port=port).start_in_thread(timeout_s=10)
    finally:
        taken.close()
