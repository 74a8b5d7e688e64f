"""serve's start-up waits on a loaded machine: a request to the router that goes unanswered is asked again until the
start-up deadline and then named (cluster/launch/readiness.py, cluster/router_client.py); placed routers that do not
start in time are named with their Ray state, progress said on the way (cluster/launch/node_routers.py)."""

from __future__ import annotations

import socket
import time

import pytest
from kvmesh.cluster.config.router_nodes import RouterNodesConfig
from kvmesh.cluster.launch.node_routers import NodeRouters
from kvmesh.cluster.launch.readiness import until_answered
from kvmesh.cluster.router_client import RouterClient
from kvmesh.router.config import RouterConfig


def test_a_router_that_does_not_answer_is_named_with_the_call():
    with socket.socket() as silent:  # accepts connections (the kernel's backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        client = RouterClient(url, timeout_s=0.3)
        try:
            with pytest.raises(TimeoutError, match=rf"the router at {url} did not answer POST /replicas within 0.3s"):
                client.register("r0", "http://127.0.0.1:1", None, None)
        finally:
            client.close()


def test_a_start_up_request_is_asked_again_while_it_times_out():
    answers = iter([TimeoutError("slow"), TimeoutError("slow"), {"healthy_replicas": ["r0"]}])

    def call():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert until_answered(call, time.monotonic() + 30, "asking the router's health") == {"healthy_replicas": ["r0"]}


def test_a_start_up_request_unanswered_past_the_deadline_says_what_was_asked():
    def call():
        raise TimeoutError("the router at http://127.0.0.1:1 did not answer POST /replicas within 5s")

    with pytest.raises(TimeoutError, match=r"registering replica-0: the router at .* did not answer POST /replicas"):
        until_answered(call, time.monotonic() + 0.2, "registering replica-0")


def test_an_error_answer_is_not_asked_again():
    calls = []

    def call():
        calls.append(1)
        raise ValueError("bad registration")

    with pytest.raises(ValueError, match="bad registration"):
        until_answered(call, time.monotonic() + 30, "registering replica-0")
    assert len(calls) == 1


class SlowStart:
    def __init__(self, seconds: float) -> None:
        time.sleep(seconds)

    def url(self) -> str:
        return "http://127.0.0.1:1"


def test_placed_routers_late_past_the_deadline_are_named_with_their_state(ray_session):
    routers = NodeRouters(RouterConfig(), RouterNodesConfig(num_routers=1, router_ready_timeout_s=0.5), "kvmesh-test",
                          report=lambda _: None)
    slow = ray_session.remote(SlowStart).options(num_cpus=0).remote(60.0)
    try:
        with pytest.raises(TimeoutError, match=r"not started after 0.5s \(routers.router_ready_timeout_s\): "
                                               r"router-0 \(node abcdef12\): [A-Z_]+"):
            routers._wait_started({"router-0 (node abcdef12)": (slow, slow.url.remote())}, time.monotonic())
    finally:
        ray_session.kill(slow, no_restart=True)


def test_a_long_start_says_which_routers_it_waits_for(ray_session, monkeypatch):
    monkeypatch.setattr("kvmesh.cluster.launch.node_routers.NOTE_EVERY_S", 0.0)
    notes: list[str] = []
    routers = NodeRouters(RouterConfig(), RouterNodesConfig(num_routers=1, router_ready_timeout_s=120.0),
                          "kvmesh-test", report=notes.append)
    slow = ray_session.remote(SlowStart).options(num_cpus=0).remote(2.0)
    try:
        routers._wait_started({"router-0 (node abcdef12)": (slow, slow.url.remote())}, time.monotonic())
    finally:
        ray_session.kill(slow, no_restart=True)
    assert notes and all(note.startswith("waiting for router-0 (node abcdef12): ") for note in notes), notes
    assert notes[0].endswith("s of 120s]"), notes
