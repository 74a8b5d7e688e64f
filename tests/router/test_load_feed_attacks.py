"""A hostile publisher on a plain stream against the router's load feed: whatever r2 sends, the router keeps routing
to the honest replicas as before, and r2 can at most look busier or idler within what it could by answering slowly
(events/load_check.py, router/replicas/load.py, router/control/published_loads.py)."""

from __future__ import annotations

import logging
import math
import time

import msgspec
import pytest
from kvmesh.events.load import encode_load_update
from kvmesh.replica.openai.router_booking import booking_header, parse_booking

from .load_feed_testkit import Fleet, update


@pytest.fixture
def fleet():
    fleet = Fleet(3)
    fleet.send("r0", update(1, running=2))
    fleet.send("r1", update(1, running=6))
    fleet.send("r2", update(1, running=8, kv_usage=0.5, queued_prefill_tokens=900))
    assert fleet.choice() == "r0"
    yield fleet
    fleet.close()


def _view(load) -> tuple:
    return load.num_running, load.num_waiting, load.queued_prefill_tokens, load.kv_usage, load.decode_load


def _refused(fleet, rid: str) -> int:
    return fleet.loads.counters().get(rid, {}).get("refused", 0)


@pytest.mark.parametrize("bad", [
    dict(kv_usage=math.nan), dict(kv_usage=-0.5), dict(kv_usage=math.inf), dict(ts=math.nan),
    dict(num_running=-1000), dict(num_waiting=-5), dict(queued_prefill_tokens=-10**6),
    dict(arrival_rate=-1.0), dict(recent_prefill=math.nan), dict(prefill_tokens_per_s=-1.0),
    dict(decode_step_s=math.inf), dict(accepted={"router-x": -3}),
])
def test_a_malformed_update_is_refused_counted_and_the_last_good_one_stands(fleet, bad):
    honest = [_view(fleet.load(rid)) for rid in ("r0", "r1")]
    before = _view(fleet.load("r2"))
    fleet.send("r2", update(2, **bad))
    fleet.send("r2", update(3, **bad))
    assert _view(fleet.load("r2")) == before
    assert _refused(fleet, "r2") == 2
    assert [_view(fleet.load(rid)) for rid in ("r0", "r1")] == honest
    assert fleet.choice() == "r0"
    fleet.send("r2", update(4, running=1))  # a good one after them is taken
    assert fleet.load("r2").num_running == 1


def test_a_bad_source_is_logged_once(fleet, caplog):
    with caplog.at_level(logging.WARNING):
        for seq in range(2, 12):
            fleet.send("r2", update(seq, kv_usage=math.nan))
    lines = [r for r in caplog.records if "r2" in r.getMessage() and "kv_usage" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in caplog.records]
    assert _refused(fleet, "r2") == 10


def test_a_far_future_timestamp_does_not_hold_back_the_replicas_next_updates(fleet):
    fleet.send("r2", update(2, running=9, ts=1e18))
    fleet.send("r2", update(3, running=1))  # the real replica's next update, by its own clock
    assert (fleet.load("r2").num_running, fleet.load("r2").published_seq) == (1, 3)


def test_a_clock_stepped_back_does_not_drop_newer_updates(fleet):
    now = time.time()
    for seq, ts in ((2, now - 3600), (3, now - 3599), (4, now - 3598)):
        fleet.send("r2", update(seq, running=seq, ts=ts))
        assert fleet.load("r2").num_running == seq


def test_a_restart_is_a_new_epoch_and_a_late_update_of_the_old_one_is_refused(fleet):
    fleet.send("r2", update(40, running=5))
    fleet.send("r2", update(0, running=3, epoch=8))  # restarted: numbers from 0 again
    assert (fleet.load("r2").num_running, fleet.load("r2").published_epoch) == (3, 8)
    fleet.send("r2", update(41, running=9))  # the old run's, arriving late
    assert fleet.load("r2").num_running == 3
    fleet.send("r2", update(1, running=4, epoch=8))
    assert fleet.load("r2").num_running == 4


def test_huge_claims_are_clamped_to_a_busy_replica(fleet):
    fleet.send("r2", update(2, running=10**15, num_waiting=10**15, queued_prefill_tokens=10**18,
                            prefill_tokens_per_s=1e300, arrival_rate=1e300, recent_prefill=1e300, recent_prompt=1.0))
    load = fleet.load("r2")
    assert load.num_running <= 1 << 16 and load.queued_prefill_tokens <= 1 << 32
    assert load.prefill_tokens_per_s <= 1e8 and load.recent_prefill <= load.recent_prompt
    assert fleet.choice() == "r0"


def test_a_huge_accepted_number_acknowledges_only_what_this_router_booked(fleet):
    tracker = fleet.router.loads
    r0 = fleet.router.replicas.get("r0")
    first = fleet.on_loop(lambda: tracker.on_dispatch(r0, 100))
    fleet.send("r0", update(2, running=2, accepted={tracker.router_id: 10**17}))
    assert fleet.load("r0").unacked_requests == 0
    second = fleet.on_loop(lambda: tracker.on_dispatch(r0, 100))
    assert (first, second) == (1, 2)  # its numbering goes on from its own bookings
    parse_booking(booking_header(tracker.router_id, second, 100)["x-kvmesh-router"])
    fleet.send("r0", update(3, running=2, accepted={tracker.router_id: 10**17}))  # the lie again
    assert fleet.load("r0").unacked_requests == 0  # booking 2 acknowledged: as a replica that accepted it at once
    third = fleet.on_loop(lambda: tracker.on_dispatch(r0, 100))
    assert third == 3 and fleet.load("r0").unacked_requests == 1
    fleet.send("r0", update(4, running=2, accepted={tracker.router_id: 10**18}))  # beyond any booking header
    assert _refused(fleet, "r0") == 1 and fleet.load("r0").unacked_requests == 1


def test_an_undecodable_frame_is_dropped(fleet):
    fleet.send("r2", msgspec.msgpack.encode([1.0, "not a seq"]), encode_load_update(update(2, running=3)))
    assert fleet.load("r2").num_running == 3
