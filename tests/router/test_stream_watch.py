"""StreamWatch: a replica whose event stream stalled, lags or lost batches is degraded (routed by load
only) and exact again once the stream caught up. Times are given, never waited for."""

import pytest
from kvmesh.router.control.stream_watch import StreamWatch
from kvmesh.router.replicas.replica import INCOMPATIBLE
from kvmesh.router.routing.kv_router import KVRouter

from .helpers import stored

BS = 4
PROMPT = list(range(1, 33))  # 8 full blocks
LAG = 5.0


@pytest.fixture
def router():
    router = KVRouter(block_size=BS)
    router.add_replica("r")
    router.add_replica("other")
    router.apply_events("r", [stored(PROMPT, BS)])
    return router


@pytest.fixture
def watch(router):
    return StreamWatch(LAG, router)


def report(seq, **kw):
    return {"num_requests_running": 0, "kv_events_seq": seq, "kv_events_unsent_s": 0.0, **kw}


def poll(watch, seq, applied, now, **kw):
    watch.on_report(watch.replicas.get("r"), report(seq, **kw), applied, sent_at=1000.0, received_at=1000.0, now=now)


def test_an_idle_replica_is_never_degraded(router, watch):
    for t in range(0, 3600, 60):  # an hour without a single event: the router applied all there is
        poll(watch, 41, 41, now=float(t))
        watch.tick(watch.replicas.get("r"), now=float(t))
    assert router.degraded == {}


def test_a_stream_briefly_behind_is_not_degraded(router, watch):
    poll(watch, 10, 8, now=0.0)
    poll(watch, 15, 12, now=LAG - 1)  # still behind, but batch 10 arrived in time
    poll(watch, 20, 17, now=2 * LAG - 2)
    poll(watch, 20, 20, now=2 * LAG)
    assert router.degraded == {}


def test_published_batches_not_applied_for_too_long_degrade_until_caught_up(router, watch):
    poll(watch, 10, 8, now=0.0)
    poll(watch, 12, 8, now=LAG - 0.5)
    assert router.degraded == {}
    poll(watch, 14, 8, now=LAG + 1)
    assert "stalled: 6 batches published but not applied for 6s" in router.degraded["r"]
    assert router.route(PROMPT, exclude=["other"]).matched_blocks == 0  # its matches are ignored
    poll(watch, 14, 14, now=LAG + 2)
    assert router.degraded == {}
    assert router.route(PROMPT, exclude=["other"]).matched_blocks == 8


def test_batches_published_before_the_router_joined_are_not_owed(router, watch):
    # A router (re)started after its replicas: they already published 0..41, which a source without
    # replay endpoint never sends again. An idle replica stays exact, and the first batch it publishes
    # after the join is what the router owes.
    for t in range(0, 600, 60):
        poll(watch, 41, -1, now=float(t))
    assert router.degraded == {}
    poll(watch, 42, -1, now=600.0)
    poll(watch, 42, 42, now=601.0)  # the router's first batch of it
    assert router.degraded == {}


def test_a_stream_that_never_reaches_a_late_router_still_stalls(router, watch):
    # Joining late excuses only what was published before: batches published after the router's first
    # report and never applied (a wrong topic, a dead feed) degrade the replica as before.
    poll(watch, 41, -1, now=0.0)
    poll(watch, 43, -1, now=1.0)
    poll(watch, 45, -1, now=LAG + 2)
    assert "stalled: 4 batches published but not applied for 6s" in router.degraded["r"]
    poll(watch, 45, 45, now=LAG + 3)
    assert router.degraded == {}


def test_a_publisher_holding_batches_unsent_degrades_its_replica(router, watch):
    poll(watch, 3, 3, now=0.0, kv_events_unsent_s=LAG + 2)
    assert "publisher has not sent its batches of the last 7s" in router.degraded["r"]
    poll(watch, 4, 4, now=1.0, kv_events_unsent_s=0.0)
    assert router.degraded == {}


def test_late_batches_degrade_until_one_arrives_in_time(router, watch):
    watch.on_batch(watch.replicas.get("r"), batch_ts=1000.0, now=1000.0 + LAG + 3)
    assert "lagging: a batch applied 8.0s after it was published" in router.degraded["r"]
    watch.on_batch(watch.replicas.get("r"), batch_ts=1010.0, now=1010.1)
    assert router.degraded == {}


def test_a_lagging_replica_that_goes_idle_is_exact_once_everything_is_applied(router, watch):
    watch.on_batch(watch.replicas.get("r"), batch_ts=990.0, now=990.0 + LAG + 3)  # applied at 998; polls answer at 1000
    poll(watch, 7, 7, now=50.0)
    assert "lagging" in router.degraded["r"]  # caught up, but the late batch is 2 s old: not yet
    watch.on_report(watch.replicas.get("r"), report(7), 7, sent_at=1010.0, received_at=1010.0, now=60.0)
    assert router.degraded == {}


def test_a_stream_late_by_a_steady_delay_stays_degraded_between_its_batches(router, watch):
    """Each late batch is followed by a moment where everything published is applied: no flapping."""
    for t in range(0, 30, 3):
        watch.on_batch(watch.replicas.get("r"), batch_ts=1000.0 + t - LAG - 2, now=1000.0 + t)
        watch.on_report(watch.replicas.get("r"), report(t), t, sent_at=1000.1 + t, received_at=1000.2 + t, now=float(t))
        assert "lagging" in router.degraded["r"]


def test_the_replicas_clock_offset_is_taken_out_of_the_lag(router, watch):
    """A replica whose clock is 30 s behind stamps its batches 30 s "late": not lag."""
    watch.on_report(watch.replicas.get("r"), report(1, timestamp=970.0), 1, sent_at=999.9, received_at=1000.1, now=0.0)
    watch.on_batch(watch.replicas.get("r"), batch_ts=975.0, now=1005.2)
    assert router.degraded == {}
    watch.on_batch(watch.replicas.get("r"), batch_ts=975.0, now=1005.0 + LAG + 1)
    assert "lagging" in router.degraded["r"]


def test_a_replica_that_reports_no_seq_is_watched_for_lag_only(router, watch):
    """vLLM's replicas have no kv_events_seq: nothing to compare, never "stalled"."""
    for t in range(0, 100, 10):
        watch.on_report(watch.replicas.get("r"), {"num_requests_running": 1}, -1, sent_at=1000.0, received_at=1000.0,
                        now=float(t))
    assert router.degraded == {}


def test_lost_events_degrade_until_a_snapshot_resync(router, watch):
    watch.on_lost(watch.replicas.get("r"), "no snapshot answer in 1s", has_snapshots=True, now=0.0)
    assert "lost events (no snapshot answer in 1s); resyncing from a snapshot" in router.degraded["r"]
    watch.tick(watch.replicas.get("r"), now=10 * LAG)
    assert "r" in router.degraded  # time alone does not make it exact
    watch.on_snapshot(watch.replicas.get("r"))
    assert router.degraded == {}


def test_lost_events_of_a_source_without_snapshots_are_outlived(router, watch):
    watch.on_lost(watch.replicas.get("r"), "the lost batches cannot be replayed or snapshotted", has_snapshots=False,
                  now=0.0)
    assert "relearned from new events" in router.degraded["r"]
    watch.tick(watch.replicas.get("r"), now=LAG - 1)
    assert "r" in router.degraded
    watch.tick(watch.replicas.get("r"), now=LAG + 1)
    assert router.degraded == {}


def test_causes_are_independent(router, watch):
    """A stream that catches up does not lift a block-size mismatch, nor the reverse."""
    router.set_degraded(router.replicas.get("r"), "its block size is 32 tokens", INCOMPATIBLE)
    poll(watch, 9, 1, now=0.0)
    poll(watch, 9, 1, now=LAG + 1)
    assert router.degraded["r"].startswith("its block size is 32 tokens; event stream stalled")
    assert set(watch.replicas.get("r").degraded) == {"incompatible", "stalled"}
    poll(watch, 9, 9, now=LAG + 2)
    assert router.degraded == {"r": "its block size is 32 tokens"}
    router.set_degraded(router.replicas.get("r"), None, INCOMPATIBLE)
    assert router.degraded == {} and watch.replicas.get("r").degraded == {}


def test_an_unknown_cause_is_refused(router):
    with pytest.raises(ValueError, match="unknown degraded cause 'slow'"):
        router.set_degraded(router.replicas.get("r"), "why", "slow")


def test_a_connection_down_for_too_long_degrades_until_it_is_back(router, watch):
    """What a vLLM replica shows of a dead publisher: the subscriber's connection to it drops."""
    watch.tick(watch.replicas.get("r"), disconnected_s=LAG - 1, now=0.0)
    assert router.degraded == {}
    watch.tick(watch.replicas.get("r"), disconnected_s=LAG + 1, now=1.0)
    assert "no connection to its publisher for 6s" in router.degraded["r"]
    poll(watch, 9, 9, now=2.0)  # a report that is caught up does not lift what the link shows
    assert "r" in router.degraded
    watch.tick(watch.replicas.get("r"), disconnected_s=None, now=3.0)
    assert router.degraded == {}
