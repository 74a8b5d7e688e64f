"""The autoscaling policy on a clock of its own: delays, bounds, and which replica it drains."""

from __future__ import annotations

import pytest
from kvmesh.cluster.config.autoscale import AutoscaleConfig
from kvmesh.cluster.fleet.autoscaler import Autoscaler, cheapest_to_lose, desired_replicas

CFG = AutoscaleConfig(scale_with_load=True, min_replicas=1, max_replicas=3, target_in_flight=4,
                      upscale_delay_s=2, downscale_delay_s=10)


def rows(*in_flight, exclusive=None, draining=()):
    exclusive = exclusive or [0] * len(in_flight)
    return [{"id": f"replica-{i}", "in_flight": n, "exclusive_blocks": exclusive[i], "draining": i in draining}
            for i, n in enumerate(in_flight)]


def test_desired_follows_in_flight_within_the_bounds():
    assert desired_replicas(CFG, rows(0))[0] == 1
    assert desired_replicas(CFG, rows(4))[0] == 1
    assert desired_replicas(CFG, rows(5))[0] == 2
    assert desired_replicas(CFG, rows(6, 6))[0] == 3
    assert desired_replicas(CFG, rows(40, 40))[0] == 3  # max_replicas


def test_requests_waiting_in_the_routers_admission_count_as_in_flight():
    # admission holds what a replica cannot start soon in the router: 1 sent, 7 held is a load of 8, not 1
    desired, reason = desired_replicas(CFG, rows(1), waiting=7)
    assert desired == 2 and "8 in flight" in reason and "7 waiting in the router" in reason
    scaler = Autoscaler(CFG)
    assert scaler.observe(0.0, rows(1), waiting=11) is None
    assert scaler.observe(2.0, rows(1), waiting=11).target == 3


def test_queued_prefill_tokens_count_when_targeted():
    cfg = AutoscaleConfig(scale_with_load=True, max_replicas=4, target_in_flight=100, target_queued_prefill_tokens=1000)
    desired, reason = desired_replicas(cfg, [{"id": "r", "in_flight": 1, "prefill_backlog": 2500}])
    assert desired == 3 and "2500 queued prefill tokens" in reason


def test_scale_up_waits_for_the_upscale_delay_and_jumps_to_desired():
    scaler = Autoscaler(CFG)
    assert scaler.observe(0.0, rows(12)) is None
    assert scaler.observe(1.9, rows(12)) is None
    decision = scaler.observe(2.0, rows(12))
    assert decision.action == "up" and (decision.current, decision.target) == (1, 3)
    assert "12 in flight" in decision.reason


def test_a_dip_restarts_the_delay():
    scaler = Autoscaler(CFG)
    assert scaler.observe(0.0, rows(12)) is None
    assert scaler.observe(1.5, rows(2)) is None  # the wish to grow ended
    assert scaler.observe(3.0, rows(12)) is None
    assert scaler.observe(5.0, rows(12)).action == "up"


def test_scale_down_one_at_a_time_draining_the_cheapest_replica():
    scaler = Autoscaler(CFG)
    idle = rows(0, 1, 0, exclusive=[50, 3, 7])
    assert scaler.observe(0.0, idle) is None
    assert scaler.observe(9.9, idle) is None
    decision = scaler.observe(10.0, idle)
    assert decision.action == "down" and (decision.current, decision.target) == (3, 2)
    assert decision.victim == "replica-1"  # fewest blocks no other replica holds
    assert scaler.observe(10.5, idle) is None  # the delay starts again for the next one


def test_draining_replicas_do_not_count_as_serving():
    scaler = Autoscaler(CFG)
    two_left = rows(0, 0, 0, draining=(2,))
    scaler.observe(0.0, two_left)
    decision = scaler.observe(10.0, two_left)
    assert decision.current == 2 and decision.victim in ("replica-0", "replica-1")


def test_below_min_replicas_scales_up_at_once():
    scaler = Autoscaler(AutoscaleConfig(scale_with_load=True, min_replicas=2, max_replicas=3, upscale_delay_s=60))
    decision = scaler.observe(0.0, rows(0))
    assert decision.action == "up" and decision.target == 2


def test_ties_go_to_the_least_busy_then_the_name():
    assert cheapest_to_lose(rows(3, 1, 1, exclusive=[0, 0, 0])) == "replica-1"


@pytest.mark.parametrize("kwargs, message", [
    ({"min_replicas": 0}, "min_replicas=0 must be at least 1"),
    ({"min_replicas": 3, "max_replicas": 2}, "max_replicas=2 is below"),
    ({"target_in_flight": 0}, "target_in_flight=0"),
    ({"upscale_delay_s": -1}, "upscale_delay_s=-1"),
    ({"decision_interval_s": 0}, "decision_interval_s=0"),
])
def test_bad_settings_are_refused_with_the_field_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AutoscaleConfig(**kwargs)


def test_serve_refuses_a_starting_count_outside_the_bounds():
    from kvmesh.cluster.config.trees import ReplicasConfig, ServeConfig

    with pytest.raises(ValueError,
                       match=r"num_replicas=5 is outside autoscale.min_replicas=1..autoscale.max_replicas=3"):
        ServeConfig(replicas=ReplicasConfig(num_replicas=5),
                    autoscale=AutoscaleConfig(scale_with_load=True, max_replicas=3))
    assert ServeConfig(replicas=ReplicasConfig(num_replicas=5)).max_replica_slots == 6  # bounds off: not checked
