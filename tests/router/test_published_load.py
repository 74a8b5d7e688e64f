"""Routers that share no memory see a replica's load from what it publishes (events/load.py), each adding only its
own bookings the replica has not counted yet (router/replicas/bookings.py, LoadTracker.apply_published)."""

from __future__ import annotations

import pytest
from kvmesh.events.load import ReplicaLoadUpdate
from kvmesh.events.publish.load_ledger import LoadLedger
from kvmesh.replica.openai.router_booking import booking_header, parse_booking
from kvmesh.replica.serving.load_report import LoadReport
from kvmesh.router.replicas import load as replica_load
from kvmesh.router.replicas.bookings import Bookings
from kvmesh.router.replicas.replica import READY, Replica
from kvmesh.router.routing.load import BOOKING_MAX_AGE_S, LoadTracker


def _routers(n: int, *replicas: str) -> list[LoadTracker]:
    out = []
    for k in range(n):
        tracker = LoadTracker(router_id=f"router-{k}")
        for rid in replicas:
            tracker.replicas.add(Replica(rid, healthy=True, state=READY))
        out.append(tracker)
    return out


class _Replica:
    """A replica's side: what it accepted per router, its queue, and the update it publishes."""

    def __init__(self) -> None:
        self.ledger = LoadLedger()
        self.waiting: list[int] = []  # uncached prompt tokens of each queued request

    def accept(self, tracker: LoadTracker, number: int | None, tokens: int, now: float) -> None:
        self.ledger.accept(None if number is None else (tracker.router_id, number), tokens, tokens, now)
        self.waiting.append(tokens)

    def publish(self, now: float) -> ReplicaLoadUpdate:
        return self.ledger.update(now, now, 0, len(self.waiting), sum(self.waiting), 0.1)


def test_every_router_sees_the_published_load_and_adds_only_its_own_unacknowledged_bookings():
    a, b = _routers(2, "r0")
    replica = _Replica()
    first = replica.publish(0.0)
    for tracker in (a, b):
        tracker.apply_published(tracker.replicas.get("r0"), first, now=0.0)
    n1 = a.on_dispatch(a.replicas.get("r0"), 300, now=0.1)
    n2 = b.on_dispatch(b.replicas.get("r0"), 500, now=0.1)
    assert (n1, n2) == (1, 1)  # each router numbers its own bookings
    # before the replica says anything, each router sees its own booking only
    assert (a.loads["r0"].prefill_backlog, b.loads["r0"].prefill_backlog) == (300, 500)
    replica.accept(a, n1, 300, 0.11)
    replica.accept(b, n2, 500, 0.11)
    n3 = a.on_dispatch(a.replicas.get("r0"), 200, now=0.12)  # sent after the replica's next update was read
    update = replica.publish(0.12)
    for tracker in (a, b):
        tracker.apply_published(tracker.replicas.get("r0"), update, now=0.13)
    # b: the replica's 800 queued tokens (a's 300 counted there, not twice); a: those plus its unacknowledged 200
    assert (b.loads["r0"].prefill_backlog, b.loads["r0"].decode_load) == (800, 2)
    assert (a.loads["r0"].prefill_backlog, a.loads["r0"].decode_load) == (1000, 3)
    assert (a.loads["r0"].unacked_requests, a.loads["r0"].unacked_prefill_tokens) == (1, 200)
    replica.accept(a, n3, 200, 0.14)
    update = replica.publish(0.15)
    for tracker in (a, b):
        tracker.apply_published(tracker.replicas.get("r0"), update, now=0.16)
    assert a.loads["r0"].prefill_backlog == b.loads["r0"].prefill_backlog == 1000  # the same view, nothing twice
    assert a.loads["r0"].unacked_requests == 0


def test_the_fleet_rates_come_from_the_replica_not_from_one_routers_share():
    a, b = _routers(2, "r0")
    replica = _Replica()
    for k in range(30):
        replica.accept(a if k % 2 else b, None, 100, k * 0.1)
    update = replica.publish(3.0)
    a.apply_published(a.replicas.get("r0"), update, now=3.0)
    b.apply_published(b.replicas.get("r0"), update, now=3.0)
    assert a.loads["r0"].arrival_rate == b.loads["r0"].arrival_rate == pytest.approx(update.arrival_rate)
    assert update.arrival_rate > 0.9  # 30 requests in 3 s over a 30 s window
    assert a.loads["r0"].recent_prefill > 0


def test_an_older_update_is_ignored_and_a_restarted_replica_is_taken():
    (a,) = _routers(1, "r0")
    new = ReplicaLoadUpdate(ts=10.0, seq=5, num_running=4, num_waiting=0, queued_prefill_tokens=0, kv_usage=0.0,
                            accepted={}, epoch=1)
    old = ReplicaLoadUpdate(ts=11.0, seq=4, num_running=1, num_waiting=0, queued_prefill_tokens=0, kv_usage=0.0,
                            accepted={}, epoch=1)
    a.apply_published(a.replicas.get("r0"), new, now=0.0)
    a.apply_published(a.replicas.get("r0"), old, now=0.0)  # a lower seq: older, whatever its clock says
    assert a.loads["r0"].num_running == 4
    restarted = ReplicaLoadUpdate(ts=1.0, seq=0, num_running=0, num_waiting=0, queued_prefill_tokens=0,
                                  kv_usage=0.0, accepted={}, epoch=2)
    a.apply_published(a.replicas.get("r0"), restarted, now=0.0)  # a new epoch: taken, whatever its clock says
    assert (a.loads["r0"].num_running, a.loads["r0"].published_seq, a.loads["r0"].published_epoch) == (0, 0, 2)


def test_a_booking_never_accepted_is_dropped_when_a_later_one_is_or_when_it_is_old():
    bookings = Bookings()
    lost = bookings.book(100, now=0.0)
    kept = bookings.book(50, now=0.5)
    bookings.acknowledge(0, now=1.0, max_age_s=BOOKING_MAX_AGE_S)
    assert (bookings.unacked_requests, bookings.unacked_tokens) == (2, 150)
    bookings.acknowledge(0, now=0.1 + BOOKING_MAX_AGE_S, max_age_s=BOOKING_MAX_AGE_S)  # the lost one is too old
    assert (bookings.unacked_requests, bookings.unacked_tokens) == (1, 50)
    bookings.acknowledge(kept, now=3.0, max_age_s=BOOKING_MAX_AGE_S)
    assert (bookings.unacked_requests, bookings.unacked_tokens) == (0, 0)
    assert lost < kept


def test_without_a_published_load_the_load_polls_count_and_a_stopped_one_gives_way_to_them(monkeypatch):
    (a,) = _routers(1, "r0")
    assert a.on_dispatch(a.replicas.get("r0"), 100) is None  # a replica that never published: no booking, no header
    report = LoadReport(num_requests_running=3, num_requests_waiting=2, kv_cache_usage=0.5,
                        num_waiting_prefill_tokens=700)
    a.loads["r0"].update_report(report)
    assert (a.loads["r0"].decode_load, a.loads["r0"].prefill_backlog) == (5, 700)
    update = ReplicaLoadUpdate(ts=1.0, seq=0, num_running=1, num_waiting=0, queued_prefill_tokens=0,
                               kv_usage=0.1, accepted={})
    a.apply_published(a.replicas.get("r0"), update)
    a.loads["r0"].update_report(report)  # a poll while the published load is fresh: the published counts win
    assert a.loads["r0"].num_running == 1
    now = replica_load.time.monotonic()
    monkeypatch.setattr(replica_load.time, "monotonic", lambda: now + replica_load.PUBLISHED_FRESH_S + 1)
    a.loads["r0"].update_report(report)  # the published load stopped: the poll counts again
    assert a.loads["r0"].num_running == 3


def test_the_booking_header_round_trips_and_a_malformed_one_is_refused_by_name():
    header = booking_header("4242-abcdef", 7, 300)
    assert parse_booking(header["x-kvmesh-router"]) == ("4242-abcdef", 7, 300)
    for bad in ("", "id:7", "id:x:3", ":7:3", "a" * 65 + ":1:1", "id:²:3", "id:1:-3"):
        with pytest.raises(ValueError, match="x-kvmesh-router"):
            parse_booking(bad)


@pytest.mark.parametrize("name", ["x-kvmesh-router", "X-KvMesh-Router"])
def test_a_client_may_not_book_its_request_on_a_routers_load(fakes, start_router, name):
    import httpx

    from .conftest import fake_stats, wait_for

    router = start_router([fakes[0].spec])
    wait_for(lambda: router.runtime.router.healthy, what="the replica healthy")
    fakes[0].configure(reset_stats=True)
    r = httpx.post(router.url + "/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 2},
                   headers={name: "forged:1:0"}, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "x-kvmesh-router" and "the router sets it" in error["message"], error
    assert fake_stats(fakes[0])["tenants_seen"] == []  # nothing reached the replica
