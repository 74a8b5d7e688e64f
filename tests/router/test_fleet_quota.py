"""A tenant's token bucket is the fleet's: routers exchange their tenants' token totals through a database
(router/admission/fleet_ledger.py, router/control/quota_sync.py, router/control/quota_store.py)."""

from __future__ import annotations

import asyncio
import math

import pytest
from kvmesh.replica.openai.responses_api.store_config import ResponsesStoreConfig
from kvmesh.router.admission.config import AdmissionConfig
from kvmesh.router.admission.fleet_ledger import FleetLedger
from kvmesh.router.admission.ledger import LocalLedger
from kvmesh.router.admission.rate_limit import TokenRate
from kvmesh.router.control.quota_store import HEARTBEAT, QuotaUnavailable, SQLiteQuotaStore
from kvmesh.router.control.quota_sync import QuotaSync, fleet_quota

LIMIT = TokenRate(100.0, 200.0)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _router(store, clock: Clock, group: str | None = None) -> tuple[FleetLedger, QuotaSync]:
    ledger = FleetLedger(LocalLedger(60.0))
    ledger.known("team", LIMIT)
    return ledger, QuotaSync(ledger, lambda: store, 0.1, 1.0, group, clock=clock)


def _exchange(*syncs: QuotaSync) -> list[bool]:
    return [asyncio.run(s.exchange()) for s in syncs]


@pytest.fixture
def store(tmp_path):
    s = SQLiteQuotaStore(tmp_path / "quota.sqlite3", timeout_s=1.0)
    yield s
    s.close()


def test_tokens_taken_through_one_router_empty_the_bucket_of_the_other(store):
    clock = Clock()
    (a, sa), (b, sb) = _router(store, clock), _router(store, clock)
    _exchange(sa, sb)
    assert a.try_take("team", 200, LIMIT, clock.now) == 0.0  # the whole burst, through router a
    _exchange(sa, sb)
    assert b.try_take("team", 50, LIMIT, clock.now) == pytest.approx(0.5)  # b's copy is empty too


def test_two_routers_serve_the_rate_of_one_over_a_long_run(store):
    clock = Clock()
    routers = [_router(store, clock) for _ in range(2)]
    _exchange(*(s for _, s in routers))
    served, start = 0, clock.now
    for step in range(1000):  # 10 s: each router offers 20 tokens every 10 ms, exchanges every 100 ms
        clock.now += 0.01
        for ledger, _ in routers:
            if ledger.try_take("team", 20, LIMIT, clock.now) == 0.0:
                served += 20
        if step % 10 == 0:
            _exchange(*(s for _, s in routers))
    rate = (served - LIMIT.burst_tokens) / (clock.now - start)
    assert 95 <= rate <= 110, rate  # one bucket's rate, not two


def test_output_charged_after_the_request_counts_for_the_fleet(store):
    clock = Clock()
    (a, sa), (b, sb) = _router(store, clock), _router(store, clock)
    _exchange(sa, sb)
    a.charge("team", 2.0, 300, LIMIT, clock.now)  # a long answer: the bucket in debt
    _exchange(sa, sb)
    assert b.try_take("team", 1, LIMIT, clock.now) == pytest.approx(1.01)


def test_a_router_that_starts_late_is_charged_from_its_start(store):
    clock = Clock()
    a, sa = _router(store, clock)
    _exchange(sa)
    a.try_take("team", 150, LIMIT, clock.now)
    _exchange(sa)
    b, sb = _router(store, clock)
    _exchange(sb)  # b's first exchange: a's total so far only noted (b's copy starts full)
    assert b.try_take("team", 200, LIMIT, clock.now) == 0.0
    _exchange(sb, sa)
    assert a.try_take("team", 1, LIMIT, clock.now) > 0  # b's 200 reached a


@pytest.mark.parametrize("bad", [math.nan, math.inf, -5.0, "lots"])
def test_a_total_that_is_not_a_count_is_ignored(bad):
    ledger = FleetLedger(LocalLedger(60.0))
    ledger.known("team", LIMIT)
    ledger.absorb([("r1", "team", 0.0)], 1.0, first=True)
    assert ledger.absorb([("r1", "team", bad)], 1.0) == 0
    assert ledger.try_take("team", 200, LIMIT, 1.0) == 0.0


def test_a_total_that_went_down_is_a_new_start_not_a_credit():
    ledger = FleetLedger(LocalLedger(60.0))
    ledger.known("team", LIMIT)
    ledger.absorb([("r1", "team", 500.0)], 1.0, first=True)
    assert ledger.absorb([("r1", "team", 10.0)], 1.0) == 0
    assert ledger.absorb([("r1", "team", 60.0)], 1.0) == 50


def test_a_sibling_worker_never_charges_the_others_tokens_twice():
    ledger = FleetLedger(LocalLedger(60.0), applies=False)
    ledger.known("team", LIMIT)
    ledger.absorb([("r1", "team", 0.0)], 1.0, first=True)
    assert ledger.absorb([("r1", "team", 150.0)], 1.0) == 0


class Down:
    def exchange(self, router, totals, wall):
        raise QuotaUnavailable("PostgreSQL: OperationalError")

    def close(self) -> None:
        pass


def test_a_database_down_splits_the_rate_among_the_routers_last_seen(store):
    clock = Clock()
    (a, sa), (_, sb) = _router(store, clock, "host-a"), _router(store, clock, "host-b")
    _exchange(sa, sb, sa)
    assert sa.alive == 2
    sa.store = Down()
    assert _exchange(sa) == [False]
    clock.now += 0.5

    async def tick() -> None:
        sa.tick()
        await sa._running

    asyncio.run(tick())
    assert a.share == 1.0  # not stale yet
    clock.now += 1.0
    asyncio.run(tick())
    assert a.share == 0.5 and sa.degraded
    a.try_take("team", 200, LIMIT, clock.now)
    assert a.try_take("team", 50, LIMIT, clock.now) == pytest.approx(1.0)  # 50 tokens at 50/s
    sa.store = store
    assert _exchange(sa) == [True] and a.share == 1.0 and not sa.degraded


def test_a_database_that_cannot_be_opened_is_a_failed_exchange_not_a_crash(tmp_path):
    clock = Clock()
    blocker = tmp_path / "file"
    blocker.write_text("")
    ledger = FleetLedger(LocalLedger(60.0))
    sync = QuotaSync(ledger, lambda: SQLiteQuotaStore(blocker / "quota.sqlite3", 1.0), 0.1, 1.0, clock=clock)
    assert _exchange(sync) == [False] and sync.failures == 1


def test_the_heartbeat_is_no_bucket(store):
    clock = Clock()
    (a, sa), (_, sb) = _router(store, clock), _router(store, clock)
    a.known(HEARTBEAT, LIMIT)  # even a bucket of that name is never charged the others' heartbeats
    _exchange(sa, sb, sa, sb, sa)
    assert a.try_take(HEARTBEAT, 200, LIMIT, clock.now) == 0.0


def test_routers_exchange_their_totals_through_postgresql(postgres):
    from kvmesh.router.control.quota_store import PostgresQuotaStore

    dsn, clock = postgres.new_database(), Clock()
    stores = [PostgresQuotaStore(dsn, 2.0) for _ in range(2)]
    try:
        (a, sa), (b, sb) = _router(stores[0], clock), _router(stores[1], clock)
        _exchange(sa, sb)
        a.try_take("team", 200, LIMIT, clock.now)
        assert _exchange(sa, sb) == [True, True]
        assert b.try_take("team", 50, LIMIT, clock.now) == pytest.approx(0.5)
    finally:
        for s in stores:
            s.close()


def test_a_postgresql_that_does_not_answer_is_a_failed_exchange(tmp_path):
    pytest.importorskip("psycopg", reason="psycopg is the postgres extra, in the dev dependencies")
    from kvmesh.router.control.quota_store import PostgresQuotaStore

    dsn = f"postgresql://postgres@/postgres?host={tmp_path}"  # no server on that socket
    sync = QuotaSync(FleetLedger(LocalLedger(60.0)), lambda: PostgresQuotaStore(dsn, 1.0), 0.1, 1.0, clock=Clock())
    assert _exchange(sync) == [False] and sync.failures == 1


def test_the_workers_of_one_host_never_charge_each_other(store):
    clock = Clock()
    (a, sa), (b, sb) = _router(store, clock, "host"), _router(store, clock, "host")  # one shared memory
    _exchange(sa, sb)
    b.try_take("team", 150, LIMIT, clock.now)  # in the host's shared bucket already, with a real SharedLedger
    _exchange(sb, sa)
    assert a.try_take("team", 200, LIMIT, clock.now) == 0.0


def _gate(ledger, admission: AdmissionConfig):
    from kvmesh.router.admission.decisions import Admission

    class Gate:
        config, tenants = admission, admission.tenants()

        def share(self, shared) -> None:
            self.admission.ledger = shared

    gate = Gate()
    gate.admission = Admission(admission, ledger)
    return gate


def test_a_hosts_worker_0_alone_charges_the_other_hosts_tokens(tmp_path):
    from kvmesh.router.admission.shared_ledger import SharedLedger

    shared, config = SharedLedger(2, 60.0), AdmissionConfig(tokens_per_s=100.0)
    responses = ResponsesStoreConfig(path=str(tmp_path / "responses.sqlite3"))
    syncs = [fleet_quota(_gate(shared.for_row(row), config), responses) for row in (0, 1)]
    assert [s.ledger.applies for s in syncs] == [True, False]
    assert {s.group for s in syncs} == {shared.group} and syncs[0].router != syncs[1].router


def test_no_exchange_without_a_limit_or_with_fleet_sync_off(tmp_path):
    responses = ResponsesStoreConfig(path=str(tmp_path / "responses.sqlite3"))
    assert fleet_quota(_gate(LocalLedger(60.0), AdmissionConfig()), responses) is None
    off = AdmissionConfig(tokens_per_s=100.0, fleet_sync_s=0)
    assert fleet_quota(_gate(LocalLedger(60.0), off), responses) is None
    assert fleet_quota(None, responses) is None


@pytest.mark.parametrize("sync_s, stale_s", [(-1.0, 2.0), (0.5, 0.5), (math.nan, 2.0)])
def test_a_bad_exchange_interval_is_refused_in_the_config(sync_s, stale_s):
    with pytest.raises(ValueError, match="fleet_sync_s"):
        AdmissionConfig(fleet_sync_s=sync_s, fleet_stale_s=stale_s)


def test_an_unexpected_exchange_error_is_logged_once_per_kind(caplog):
    class Broken:
        def exchange(self, *args):
            raise ValueError("a row the store cannot read")

        def close(self) -> None:
            pass

    sync = QuotaSync(FleetLedger(LocalLedger(60.0)), lambda: Broken(), 0.1, 1.0, clock=Clock())

    async def ticks() -> None:
        for _ in range(3):
            sync.tick()
            await asyncio.sleep(0.05)
        sync.tick()

    with caplog.at_level("ERROR", logger="kvmesh.router.control.quota_sync"):
        asyncio.run(ticks())
    logged = [r for r in caplog.records if "a row the store cannot read" in r.getMessage()]
    assert len(logged) == 1
