"""A full queue's places are shared between tenants (router/admission/queue_share.py, decisions.py): an arrival
under its share takes the place of the newest waiter of the tenant most over its share; one at or over its share
is refused itself -- in one router process and across several (shared_ledger.py)."""

from __future__ import annotations

import pytest
from kvmesh.router.admission.config import AdmissionConfig
from kvmesh.router.admission.decisions import OVER_LIMIT, QUEUE_FULL, Admission, Shed
from kvmesh.router.admission.ledger import LocalLedger
from kvmesh.router.admission.queue import Waiter
from kvmesh.router.admission.queue_share import place_in_full_queue, share_of
from kvmesh.router.admission.rate_limit import TokenRate
from kvmesh.router.admission.shared_ledger import SharedLedger
from kvmesh.router.admission.tenants import Tenant

NO_USAGE = {}.get


def _admission(max_queued: int = 8) -> Admission:
    config = AdmissionConfig(max_queued=max_queued)
    return Admission(config, LocalLedger(config.fair_share_half_life_s))


def _fill(adm: Admission, tenant: str, n: int, priority: int = 0, now: float = 0.0) -> list[Waiter]:
    waiters = [adm.arrive("m", Tenant(tenant), priority, 10, None, now) for _ in range(n)]
    assert all(isinstance(w, Waiter) for w in waiters)
    return waiters


def _waiting(adm: Admission) -> dict[str, int]:
    return adm.ledger.waiting_by_tenant("m")


# ---------------------------------------------------------------- the rule
def test_an_arrival_under_its_share_displaces_the_tenant_most_over():
    place = place_in_full_queue({"flood": 6, "other": 2}, "light", 8, lambda t: 0.0)
    assert place.displace == "flood" and place.waiting == 0 and place.share == pytest.approx(8 / 3)


def test_a_tenant_at_its_share_is_refused_itself():
    place = place_in_full_queue({"flood": 4, "light": 4}, "light", 8, lambda t: 0.0)
    assert place.displace is None and place.waiting == 4 and place.share == 4


def test_a_single_tenant_that_fills_the_queue_is_refused():
    place = place_in_full_queue({"flood": 8}, "flood", 8, lambda t: 0.0)
    assert place.displace is None and place.share == 8


def test_equally_over_tenants_tie_to_the_one_that_used_more_then_to_the_name():
    usage = {"a": 10.0, "b": 500.0, "c": 10.0}
    assert place_in_full_queue({"a": 4, "b": 4}, "light", 8, lambda t: usage.get(t, 0.0)).displace == "b"
    assert place_in_full_queue({"a": 4, "c": 4}, "light", 8, lambda t: usage.get(t, 0.0)).displace == "c"


def test_users_under_one_key_share_that_keys_places():
    flood = {f"flood/u{i}": 2 for i in range(4)}  # one key's tenant, four users
    place = place_in_full_queue(flood, "light", 8, lambda t: 0.0)
    assert place.share == 4 and place.displace.startswith("flood/")  # two keys: 4 places each, not 8/5
    even = {f"flood/u{i}": 1 for i in range(4)} | {"light": 4}
    newcomer = place_in_full_queue(even | {"flood/u0": 2, "flood/u1": 2}, "flood/u9", 8, lambda t: 0.0)
    assert newcomer.displace in ("flood/u0", "flood/u1")  # a new user of the key takes from its own key
    assert share_of(even, "flood/u9", 8) == pytest.approx(4 / 5)


def test_the_shared_keys_users_are_one_tenant_against_a_keyed_one():
    users = {f"default/user{i}": 1 for i in range(8)}  # the router's own key, eight ``user`` names
    place = place_in_full_queue(users, "team", 8, lambda t: 0.0)
    assert place.share == 4 and place.displace.startswith("default/")


# ---------------------------------------------------------------- through Admission
def test_the_flood_newest_waiter_gets_queue_full_naming_its_state_and_the_light_one_waits():
    adm = _admission()
    flood = _fill(adm, "flood", 8)
    light = adm.arrive("m", Tenant("light"), 0, 10, None, now=1.0)
    assert isinstance(light, Waiter)
    [(gone, shed)] = adm.displaced("m", now=1.0)
    assert gone is flood[-1] and shed.reason == QUEUE_FULL
    assert "tenant 'flood' had 8 requests waiting" in shed.message and "share of 4 places" in shed.message
    assert adm.displaced("m", now=1.0) == []  # answered once
    assert _waiting(adm) == {"flood": 7, "light": 1}


def test_a_refused_tenant_is_told_its_own_waiting_and_share():
    adm = _admission()
    _fill(adm, "flood", 8)
    shed = adm.arrive("m", Tenant("flood"), 0, 10, None, now=1.0)
    assert isinstance(shed, Shed) and shed.reason == QUEUE_FULL
    assert "tenant 'flood' has 8 requests waiting" in shed.message and "share of 8 places" in shed.message


def test_a_tenant_that_retries_at_once_gains_nothing_over_one_that_waits():
    adm = _admission()
    _fill(adm, "eager", 8)
    refused = [adm.arrive("m", Tenant("eager"), 0, 10, None, now=0.001 * i) for i in range(200)]
    assert all(isinstance(r, Shed) for r in refused)
    patient = [adm.arrive("m", Tenant("patient"), 0, 10, None, now=1.0) for _ in range(5)]
    assert [isinstance(p, Waiter) for p in patient] == [True] * 4 + [False]
    assert len(adm.displaced("m", now=1.0)) == 4
    assert _waiting(adm) == {"eager": 4, "patient": 4}


def test_the_displaced_waiter_is_the_newest_of_the_least_urgent():
    adm = _admission(4)
    urgent = _fill(adm, "flood", 2, priority=-1)
    batch = _fill(adm, "flood", 2, priority=5)
    assert isinstance(adm.arrive("m", Tenant("light"), 0, 10, None, now=1.0), Waiter)
    assert [w for w, _ in adm.displaced("m", 1.0)] == [batch[-1]]
    assert isinstance(adm.arrive("m", Tenant("light"), 0, 10, None, now=1.0), Waiter)
    assert [w for w, _ in adm.displaced("m", 1.0)] == [batch[0]]
    assert all(w in adm.queues["m"] for w in urgent)


def test_an_arrival_refused_for_its_limit_displaces_no_one():
    adm = _admission()
    _fill(adm, "flood", 8)
    capped = Tenant("capped", limit=TokenRate(tokens_per_s=1, burst_tokens=5))
    adm.ledger.try_take("capped", 5, capped.limit, now=1.0)  # its bucket spent
    shed = adm.arrive("m", capped, 0, 10, None, now=1.0)
    assert isinstance(shed, Shed) and shed.reason == OVER_LIMIT
    assert adm.displaced("m", 1.0) == [] and _waiting(adm) == {"flood": 8}


def test_a_queue_with_room_displaces_no_one():
    adm = _admission()
    _fill(adm, "flood", 7)
    assert isinstance(adm.arrive("m", Tenant("light"), 0, 10, None, now=1.0), Waiter)
    assert adm.displaced("m", 1.0) == []


# ---------------------------------------------------------------- across router processes
def _workers(n: int, max_queued: int = 8) -> list[Admission]:
    config = AdmissionConfig(max_queued=max_queued)
    table = SharedLedger(n, config.fair_share_half_life_s)
    return [Admission(config, table.for_row(row)) for row in range(n)]


def test_a_place_taken_in_one_process_is_given_up_by_the_one_holding_the_waiter():
    a, b = _workers(2)
    flood = _fill(a, "flood", 8)
    light = b.arrive("m", Tenant("light"), 0, 10, None, now=1.0)
    assert isinstance(light, Waiter) and b.displaced("m", 1.0) == []  # b holds none of the flood's
    [(gone, shed)] = a.displaced("m", now=1.0)
    assert gone is flood[-1] and shed.reason == QUEUE_FULL
    assert a.displaced("m", 1.0) == [] and a.ledger.debts("m") == {}
    assert b.ledger.waiting_by_tenant("m") == {"flood": 7, "light": 1}


def test_the_same_decision_in_every_process():
    a, b = _workers(2)
    _fill(a, "flood", 4)
    _fill(b, "flood", 4)
    assert isinstance(a.arrive("m", Tenant("flood"), 0, 10, None, 1.0), Shed)
    assert isinstance(b.arrive("m", Tenant("flood"), 0, 10, None, 1.0), Shed)  # its 8 are the host's, in two rows
    for adm in (a, b, a, b):
        assert isinstance(adm.arrive("m", Tenant("light"), 0, 10, None, 1.0), Waiter)
    assert isinstance(b.arrive("m", Tenant("light"), 0, 10, None, 1.0), Shed)  # light holds its share, 4
    assert len(a.displaced("m", 1.0)) + len(b.displaced("m", 1.0)) == 4
    assert a.ledger.waiting_by_tenant("m") == {"flood": 4, "light": 4}


def test_an_owed_place_is_paid_by_the_next_leaving_and_never_outlives_the_waiters():
    a, b = _workers(2)
    flood = _fill(a, "flood", 8)
    b.arrive("m", Tenant("light"), 0, 10, None, now=1.0)
    a.went(flood[0], 10, now=1.0)  # served: the freed place pays what flood owed
    assert a.ledger.debts("m") == {} and a.displaced("m", 1.0) == []
    b.arrive("m", Tenant("light"), 0, 10, None, now=1.0)  # full again: owed once more
    for w in flood[1:]:
        a.leave(w)  # every flood waiter gone (clients left): nothing is left to owe
    assert a.ledger.debts("m") == {} and a.ledger.waiting_by_tenant("m") == {"light": 2}


def test_a_dead_process_waiters_leave_the_shares():
    a, b = _workers(2)
    _fill(a, "flood", 8)
    b.ledger.clear_row(0)
    assert b.ledger.waiting_by_tenant("m") == {}
    assert isinstance(b.arrive("m", Tenant("flood"), 0, 10, None, 1.0), Waiter)
