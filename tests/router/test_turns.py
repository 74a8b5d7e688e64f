"""Turns to decide in, for routers that sync (router/control/turns.py): router k of n decides only in the turns
numbered k mod n, so in a burst that reaches them all at once each decides after the others were told it."""

from __future__ import annotations

import pytest
from kvmesh.router.control.turns import turn_wait_s


def test_each_router_waits_for_the_start_of_its_own_next_turn():
    assert turn_wait_s(0.0, 0.002, 0, 4) == 0.0
    assert turn_wait_s(0.0, 0.002, 3, 4) == pytest.approx(0.006)
    assert turn_wait_s(0.0031, 0.002, 2, 4) == pytest.approx(0.0009)  # turn 2 is [4, 6) ms
    assert turn_wait_s(0.0031, 0.002, 1, 4) == pytest.approx(0.0069)  # turn 1 passed: turn 5, at 10 ms
    assert turn_wait_s(1.0, 0.002, 1, 4) == pytest.approx(0.002)  # 1 s starts turn 500, router 0's


def test_inside_its_own_turn_a_router_goes_within_the_grace_and_else_waits_a_round():
    assert turn_wait_s(0.0004, 0.002, 0, 4, grace_s=0.001) == 0.0
    assert turn_wait_s(0.0004, 0.002, 0, 4) == pytest.approx(0.0076)  # no grace: the next round's turn 4
    assert turn_wait_s(0.0015, 0.002, 0, 4, grace_s=0.001) == pytest.approx(0.0065)


def test_a_burst_is_decided_one_router_after_another_a_turn_apart():
    """Every instant of a round: the four routers' decision times are four distinct turns, a turn apart at least."""
    for i in range(200):
        now = 12.345 + i * 0.0001
        at = sorted(now + turn_wait_s(now, 0.0015, k, 4, grace_s=0.00075) for k in range(4))
        assert all(b - a >= 0.00075 - 1e-9 for a, b in zip(at, at[1:], strict=False))
        assert at[-1] - now <= 4 * 0.0015 + 1e-9


@pytest.mark.parametrize(("turn_s", "routers"), [(0.0, 4), (0.002, 1)])
def test_no_turns_or_a_router_alone_decide_at_once(turn_s, routers):
    assert turn_wait_s(7.0011, turn_s, 0, routers) == 0.0
