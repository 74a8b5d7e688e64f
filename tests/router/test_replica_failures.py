"""What an answer says of its replica, on its record (router/http/failures.py ``ReplicaFailures``): failures counted
and ejections, the deadlines of its answers, and nothing for a record a request still holds after its replica left
the set."""

from __future__ import annotations

from kvmesh.router.config import RouterConfig
from kvmesh.router.http.failures import ReplicaFailures, count_failure, settle_5xx
from kvmesh.router.http.metrics import RouterMetrics
from kvmesh.router.http.upstream import UpstreamConnectError
from kvmesh.router.routing.kv_router import KVRouter


def _failures() -> tuple[ReplicaFailures, KVRouter, RouterMetrics]:
    router, metrics = KVRouter(block_size=16), RouterMetrics()
    for rid in ("a", "b"):
        router.add_replica(rid)
    return ReplicaFailures(RouterConfig(), router, metrics), router, metrics


def _counted(metrics: RouterMetrics, rid: str, kind: str) -> float:
    value = metrics.registry.get_sample_value("kvmesh_router_replica_failures_total", {"replica": rid, "kind": kind})
    return value or 0.0


def test_a_sick_answer_ejects_its_replica_but_never_the_last_in_rotation():
    failures, router, metrics = _failures()
    a, b = router.replicas.get("a"), router.replicas.get("b")
    failures.record_failure(a, "missed a deadline", "first_byte_deadline", sick=True)
    assert not a.healthy and a.health.ejected_until is not None and _counted(metrics, "a", "first_byte_deadline") == 1
    failures.record_failure(b, "missed a deadline", "first_byte_deadline", sick=True)
    assert b.healthy and b.health.ejected_until is None  # the last one in rotation stays
    assert _counted(metrics, "b", "first_byte_deadline") == 1


def test_a_refused_connection_takes_the_replica_out_until_its_health_probe():
    failures, router, metrics = _failures()
    a = router.replicas.get("a")
    assert count_failure(failures, a, UpstreamConnectError("refused")) == "connect"
    assert not a.healthy and router.replicas.get("b").healthy and _counted(metrics, "a", "connect") == 1


def test_a_record_held_after_its_replica_left_counts_nothing():
    failures, router, metrics = _failures()
    a = router.replicas.get("a")
    router.remove_replica("a")
    assert a.removed
    failures.record_failure(a, "answered HTTP 500", "http_5xx", sick=True)
    settle_5xx(failures, [(a, 500)], answered_elsewhere=True)
    assert _counted(metrics, "a", "http_5xx") == 0 and a.health.consecutive_failures == 0
    patience = failures.patience(a)  # the deadlines stand, kept nowhere
    assert patience is not None and a.patience is None


def test_the_deadlines_live_on_the_record():
    failures, router, _ = _failures()
    a = router.replicas.get("a")
    assert failures.patience(a) is a.patience is not None
    router.remove_replica("a")
    router.add_replica("a")  # the same name again: a new record, its own deadlines
    assert failures.patience(router.replicas.get("a")) is not a.patience
