"""Admission across the router processes of one host (router/admission/shared_ledger.py)."""

from __future__ import annotations

import multiprocessing as mp

import pytest
from kvmesh.router.admission.config import AdmissionConfig
from kvmesh.router.admission.decisions import QUEUE_FULL, WAIT, Admission, Shed
from kvmesh.router.admission.queue import Waiter
from kvmesh.router.admission.rate_limit import TokenRate
from kvmesh.router.admission.shared_ledger import OVERFLOW, SharedLedger
from kvmesh.router.admission.tenants import Tenant


def _workers(n: int, **kw) -> list[Admission]:
    config = AdmissionConfig(**kw)
    table = SharedLedger(n, config.fair_share_half_life_s)
    return [Admission(config, table.for_row(row)) for row in range(n)]


def test_usage_charged_in_one_process_weighs_in_every_other():
    a, b = _workers(2)
    a.ledger.charge("flooder", 5000.0, 0, None, now=1.0)
    assert b.ledger.usage("flooder", 1.0) == pytest.approx(5000.0)
    assert b.ledger.usage("light", 1.0) == 0.0


def test_a_tenant_bucket_is_one_across_processes():
    a, b = _workers(2)
    limit = TokenRate(tokens_per_s=10, burst_tokens=100)
    tenant = Tenant("t", None, limit)
    assert isinstance(a.arrive("m", tenant, 0, 80, None, now=0.0), Waiter)
    shed = b.arrive("m", tenant, 0, 80, None, now=0.0)
    assert isinstance(shed, Shed) and shed.retry_after_s == pytest.approx(6.0)


def test_the_queue_bound_is_the_hosts():
    a, b = _workers(2, max_queued=3)
    t = Tenant("t")
    for adm in (a, b, a):
        assert isinstance(adm.arrive("m", t, 0, 1, None, 0.0), Waiter)
    shed = b.arrive("m", t, 0, 1, None, 0.0)
    assert isinstance(shed, Shed) and shed.reason == QUEUE_FULL


def test_a_process_leaves_the_room_to_a_more_urgent_request_waiting_in_another():
    a, b = _workers(2)
    batch = a.arrive("m", Tenant("t"), 5, 1, None, 0.0)
    urgent = b.arrive("m", Tenant("u"), 0, 1, None, 0.0)
    assert a.gate(batch, None, room=True, now=0.0) == WAIT
    assert b.gate(urgent, None, room=True, now=0.0) == "go"
    b.went(urgent, 1, now=0.0)
    assert a.gate(batch, None, room=True, now=0.0) == "go"


def test_a_dead_worker_row_is_cleared():
    a, b = _workers(2)
    a.arrive("m", Tenant("t"), 0, 1, None, 0.0)
    assert b.ledger.queued("m") == 1
    b.ledger.clear_row(0)
    assert b.ledger.queued("m") == 0


def test_tenants_past_the_table_share_the_overflow_slot():
    table = SharedLedger(1, 60.0, max_tenants=3).for_row(0)
    for name in ("a", "b", "c", "d"):
        table.charge(name, 1.0, 0, None, now=0.0)
    assert table.usage("a", 0.0) == 1.0 and table.usage("b", 0.0) == 1.0
    assert table.usage("c", 0.0) == 2.0 and table.usage(OVERFLOW, 0.0) == 2.0  # c and d share slot 0


def _charge_many(table: SharedLedger, n: int) -> None:
    for _ in range(n):
        table.charge("t", 1.0, 1, TokenRate(1e-3, 1e9), now=1.0)


def test_charges_from_two_real_processes_add_up_exactly():
    ctx = mp.get_context("fork")
    table = SharedLedger(2, 1e9, context=ctx)
    procs = [ctx.Process(target=_charge_many, args=(table.for_row(row), 2000)) for row in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(10)
    assert [p.exitcode for p in procs] == [0, 0]
    assert table.usage("t", 1.0) == pytest.approx(4000.0)
