"""Outlier detection's bookkeeping (router/routing/outlier.py), on a clock the test moves."""

from __future__ import annotations

from kvmesh.router.replicas.replica import Replica
from kvmesh.router.routing.outlier import OutlierConfig, OutlierDetector


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def detector(threshold=3, base=30.0, most=300.0):
    """A detector on a clock the test moves, and the replica it judges."""
    clock = Clock()
    return OutlierDetector(OutlierConfig(threshold, base, most), clock=clock), clock, Replica("r", healthy=True)


def test_failures_in_a_row_eject_and_an_answer_in_between_starts_the_count_over():
    d, _, r = detector()
    assert d.on_failure(r, "reset", can_eject=True) is None
    assert d.on_failure(r, "reset", can_eject=True) is None
    d.on_success(r)
    assert d.on_failure(r, "reset", can_eject=True) is None
    assert d.on_failure(r, "reset", can_eject=True) is None
    assert d.on_failure(r, "HTTP 500", can_eject=True) == 30.0
    assert d.is_ejected(r) and r.health.last_failure == "HTTP 500"


def test_a_sick_answer_ejects_at_once_until_a_probe_request_is_answered():
    d, _, r = detector()
    assert d.on_failure(r, "no first byte", can_eject=True, sick=True) == 0.0
    assert d.is_ejected(r) and d.probe_due(r) and d.ejected_for_s(r) == 0.0
    assert d.on_probe(r, answered=True) is None
    assert not d.is_ejected(r) and r.health.consecutive_failures == 0


def test_failed_probes_double_the_ejection_up_to_the_cap():
    d, clock, r = detector(base=30.0, most=100.0)
    d.on_failure(r, "no first byte", can_eject=True, sick=True)
    assert d.on_probe(r, answered=False, why="timed out") == 30.0
    assert not d.probe_due(r) and d.ejected_for_s(r) == 30.0
    clock.now += 30.0
    assert d.probe_due(r)
    assert d.on_probe(r, answered=False) == 60.0
    clock.now += 60.0
    assert d.on_probe(r, answered=False) == 100.0
    assert r.health.ejections == 4


def test_the_back_off_starts_over_after_serving_the_longest_ejection_without_another():
    d, clock, r = detector(threshold=1, base=10.0, most=40.0)
    assert d.on_failure(r, "reset", can_eject=True) == 10.0
    clock.now += 10.0
    d.on_probe(r, answered=True)
    clock.now += 5.0
    d.on_success(r)
    assert d.on_failure(r, "reset", can_eject=True) == 20.0  # soon after: longer
    clock.now += 20.0
    d.on_probe(r, answered=True)
    clock.now += 41.0
    d.on_success(r)
    assert d.on_failure(r, "reset", can_eject=True) == 10.0  # served 41 s > 40 s: starts over


def test_the_last_replica_in_rotation_is_never_ejected_and_zero_turns_ejection_off():
    d, _, r = detector()
    for _ in range(5):
        assert d.on_failure(r, "reset", can_eject=False, sick=True) is None
    assert not d.is_ejected(r) and r.health.consecutive_failures == 5
    off, _, r = detector(threshold=0)
    assert off.on_failure(r, "reset", can_eject=True, sick=True) is None


def test_progress_is_seen_after_the_instant_it_is_asked_about():
    d, clock, r = detector()
    assert not d.progressed_since(r, 0.0)
    d.on_progress(r)
    assert d.progressed_since(r, clock.now - 1) and not d.progressed_since(r, clock.now)


def test_a_replica_whose_health_fails_is_down_not_an_outlier_and_its_ejection_is_lifted():
    d, _, r = detector()
    for _ in range(3):  # the streams of a killed replica break at once
        d.on_failure(r, "reset", can_eject=True)
    assert d.is_ejected(r)
    d.on_down(r)  # its /health fails: restarting; /health vouches for the new process
    assert not d.is_ejected(r) and r.health.consecutive_failures == 0
