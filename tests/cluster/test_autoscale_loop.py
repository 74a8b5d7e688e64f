"""The autoscaler's look at a cluster whose routers run on several Ray nodes, without Ray: the owner's ``GET /replicas``
and the placed routers are fakes, so what the decision counts is seen exactly."""

from __future__ import annotations

import logging

from kvmesh.cluster.config.autoscale import AutoscaleConfig
from kvmesh.cluster.fleet.autoscale_loop import AutoscaleLoop
from kvmesh.router.control.rows import ReplicaList, ReplicaRow
from prometheus_client import CollectorRegistry

CFG = AutoscaleConfig(scale_with_load=True, min_replicas=1, max_replicas=8, target_in_flight=4, upscale_delay_s=0)
HELD = 6
"""Requests each router's admission holds."""


def _row(replica_id: str) -> ReplicaRow:
    return ReplicaRow(id=replica_id, url=f"http://127.0.0.1:9/{replica_id}", role="both", events=None, replay=None,
                      events_source="none", healthy=True, draining=False, degraded=None, in_flight=0,
                      prefill_backlog=0)


class _Owner:
    """The owner's ``GET /replicas``: one idle replica, and ``waiting`` requests its admission holds."""

    def __init__(self, waiting: int) -> None:
        self.list = ReplicaList([_row("replica-0")], waiting)

    def replica_list(self, drain_cost: bool = False) -> ReplicaList:
        return self.list

    def replica_rows(self, drain_cost: bool = False) -> list[ReplicaRow]:
        return self.list.replicas


class _Placed:
    """A placed router: the requests its admission holds, or no answer in time."""

    def __init__(self, name: str, waiting: int = 0, error: Exception | None = None) -> None:
        self.name, self.held, self.error = name, waiting, error

    def waiting(self) -> int:
        if self.error is not None:
            raise self.error
        return self.held


def _loop(owner: _Owner, placed: list[_Placed]) -> AutoscaleLoop:
    return AutoscaleLoop(CFG, owner, CollectorRegistry(), lambda: placed)  # type: ignore[arg-type]


def test_the_decision_counts_what_every_router_holds():
    decision = _loop(_Owner(HELD), [_Placed("router-0", HELD)]).look({"replica-0"})
    assert decision is not None and decision.action == "up"
    assert decision.target == 3 and f"{2 * HELD} waiting in the routers" in decision.reason  # 12 / 4 per replica


def test_a_placed_router_that_does_not_answer_is_left_out_and_said_once(caplog):
    silent = _Placed("router-1", HELD, error=TimeoutError("no answer in 1s"))
    loop = _loop(_Owner(0), [_Placed("router-0", HELD), silent, _Placed("router-2", HELD)])
    with caplog.at_level(logging.WARNING, logger="kvmesh.cluster.fleet.autoscale_loop"):
        first, second = loop.look({"replica-0"}), loop.look({"replica-0"})
    for decision in (first, second):
        assert decision is not None and f"{2 * HELD} waiting in the routers" in decision.reason
    said = [r.getMessage() for r in caplog.records if "router-1" in r.getMessage()]
    assert len(said) == 1 and "TimeoutError" in said[0], caplog.text
    silent.error = None  # it answers again: counted, and a later silence is said again
    assert f"{3 * HELD} waiting in the routers" in loop.look({"replica-0"}).reason


def test_without_placed_routers_the_owner_alone_is_counted():
    loop = AutoscaleLoop(CFG, _Owner(HELD), CollectorRegistry())  # type: ignore[arg-type]
    decision = loop.look({"replica-0"})
    assert decision is not None and decision.target == 2 and f"{HELD} waiting in the routers" in decision.reason


class _Admission:
    """The router's ``AdmissionGate`` as the follower reads it: ``admission.waiting()``."""

    def __init__(self, waiting: int) -> None:
        self.admission, self.held = self, waiting

    def waiting(self) -> int:
        return self.held


class _Server:
    def __init__(self, runtime) -> None:
        self.runtime = runtime


class _Unreachable:
    """The board while Ray restarts it: every read fails."""

    def __getattr__(self, name: str):
        raise ConnectionError("actor restarting")


def test_a_placed_router_notes_what_its_admission_holds_on_its_own_loop_even_without_the_board():
    import asyncio

    from kvmesh.cluster.launch.node_router import BoardFollower
    from kvmesh.router.config import RouterConfig
    from kvmesh.router.control.runtime import RouterRuntime

    runtime = RouterRuntime(RouterConfig())
    follower = BoardFollower(_Server(runtime), _Unreachable(), "router-0")
    asyncio.run(follower.follow_once())
    assert follower.waiting == 0  # admission off: nothing held
    runtime.admission = _Admission(HELD)  # type: ignore[assignment]
    asyncio.run(follower.follow_once())
    assert follower.waiting == HELD
