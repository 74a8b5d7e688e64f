"""``kvmesh sim --arrival-seed``: arrivals drawn inside their tick, the same for every policy, another per seed."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from kvmesh.cluster.measure.workloads.arrivals import detect, spread_arrivals
from kvmesh.cluster.measure.workloads.traces import MooncakeRecord


def coarse_trace(ticks=20, per_tick=10, tick_ms=3000):
    return [MooncakeRecord(t * tick_ms, 600, 4, (t * 100 + i,)) for t in range(ticks) for i in range(per_tick)]


def test_coarse_clock_arrivals_stay_inside_their_tick():
    records = coarse_trace()
    res = detect(records)
    assert res.coarse and res.tick_ms == 3000 and res.per_stamp == 10
    moved, line = spread_arrivals(records, 7)
    assert "3000 ms clock" in line and "arrival seed 7" in line
    by_id = {r.hash_ids: r.timestamp_ms for r in records}
    for r in moved:
        assert by_id[r.hash_ids] <= r.timestamp_ms < by_id[r.hash_ids] + 3000
    assert [r.timestamp_ms for r in moved] == sorted(r.timestamp_ms for r in moved)
    assert len({r.timestamp_ms for r in moved}) == len(records)  # no tick's requests at one instant any more


def test_distinct_stamps_jitter_within_half_the_mean_gap():
    records = [MooncakeRecord(t * 250.0 + (t % 3), 600, 4, (t,)) for t in range(100)]
    res = detect(records)
    assert not res.coarse
    moved, line = spread_arrivals(records, 1)
    assert "distinct timestamps" in line
    by_id = {r.hash_ids: r.timestamp_ms for r in records}
    for r in moved:
        assert by_id[r.hash_ids] <= r.timestamp_ms < by_id[r.hash_ids] + res.tick_ms
    assert res.tick_ms == pytest.approx(0.5 * (records[-1].timestamp_ms - records[0].timestamp_ms) / 99)


def test_same_seed_same_arrivals_other_seed_other_arrivals():
    records = coarse_trace()
    first, _ = spread_arrivals(records, 3)
    assert spread_arrivals(records, 3)[0] == first
    assert [r.timestamp_ms for r in spread_arrivals(records, 4)[0]] != [r.timestamp_ms for r in first]


def _run_sim(tmp_path, monkeypatch, *flags):
    """``kvmesh sim`` on a window of the Mooncake trace; returns its report and each policy's arrival times."""
    from kvmesh.cluster import cli
    from kvmesh.cluster.measure.sim import run as sim_run
    from kvmesh.cluster.measure.sim.loop import run_policy as real

    seen: dict[str, list[float]] = {}

    def recording(name, requests, *args, **kwargs):
        seen[name] = [r.arrival_s for r in requests]
        return real(name, requests, *args, **kwargs)

    monkeypatch.setattr(sim_run, "run_policy", recording)
    out = tmp_path / "sim.json"
    rc = cli.main(["sim", "--limit", "60", "--num-replicas", "2", "--max-prompt-blocks", "16", "--policies",
                   "round_robin,dynamo,sglang",
                   "--out", str(out), "--no-plot", "--no-progress", "--no-ceilings", *flags])
    assert rc == 0
    return json.loads(out.read_text()), seen


def test_every_policy_sees_the_same_arrivals(tmp_path, monkeypatch):
    plain, plain_seen = _run_sim(tmp_path, monkeypatch)
    assert "arrivals" not in plain["trace"]
    seeded, seen = _run_sim(tmp_path, monkeypatch, "--arrival-seed", "2")
    assert seen["round_robin"] == seen["dynamo"] == seen["sglang"]
    assert seen["dynamo"] != plain_seen["dynamo"]
    assert seeded["trace"]["arrivals"].startswith("arrival seed 2: distinct timestamps")
    other, other_seen = _run_sim(tmp_path, monkeypatch, "--arrival-seed", "3")
    assert other_seen["dynamo"] != seen["dynamo"]


def test_generated_workload_is_redrawn(tmp_path):
    from kvmesh.cluster.commands.sim import load_replication
    from kvmesh.cluster.measure.sim.options import SimWorkloadOptions
    from kvmesh.cluster.measure.workloads.settings import WorkloadShape

    w = SimWorkloadOptions(workload="chatbot", num_requests=40)
    plain, line = load_replication(w, WorkloadShape(), 0)
    assert line is None
    a, line_a = load_replication(SimWorkloadOptions(workload="chatbot", num_requests=40, arrival_seed=1),
                                 WorkloadShape(), 0)
    b, _ = load_replication(SimWorkloadOptions(workload="chatbot", num_requests=40, arrival_seed=1), WorkloadShape(), 0)
    c, _ = load_replication(SimWorkloadOptions(workload="chatbot", num_requests=40, arrival_seed=2), WorkloadShape(), 0)
    assert "redrawn" in line_a and a == b and a != c and a != plain


def test_a_coarse_clock_puts_each_ticks_requests_together_and_the_order_seed_draws_only_their_order():
    from kvmesh.cluster.measure.workloads.arrivals import on_clock, shuffle_ticks

    fine = [MooncakeRecord(t * 130.0, 600, 4, (t,)) for t in range(40)]
    ticked = on_clock(fine, 1000)
    assert [r.timestamp_ms for r in ticked] == [(t * 130 // 1000) * 1000.0 for t in range(40)]
    a, line = shuffle_ticks(ticked, 5)
    assert "arrive together" in line and "arrival seed 5" in line
    assert [r.timestamp_ms for r in a] == [r.timestamp_ms for r in ticked]  # stamps kept, in order
    assert sorted(r.hash_ids for r in a) == sorted(r.hash_ids for r in ticked)
    assert shuffle_ticks(ticked, 5)[0] == a and shuffle_ticks(ticked, 6)[0] != a
    assert {r.hash_ids for r in a[:8]} == {r.hash_ids for r in ticked[:8]}  # the first tick's 8 stay in it


def test_jitter_on_a_coarse_clock_spreads_each_request_inside_its_tick():
    from kvmesh.cluster.commands.sim import load_replication
    from kvmesh.cluster.measure.sim.options import SimWorkloadOptions
    from kvmesh.cluster.measure.workloads.settings import WorkloadShape

    w = SimWorkloadOptions(limit=200, arrival_clock_ms=1000, arrival_seed=2)
    plain, _ = load_replication(SimWorkloadOptions(limit=200), WorkloadShape(), 0)
    moved, line = load_replication(w, WorkloadShape(), 0)
    assert "1000 ms clock" in line
    ticks = Counter((r.hash_ids, r.timestamp_ms // 1000) for r in plain)
    assert Counter((r.hash_ids, r.timestamp_ms // 1000) for r in moved) == ticks
    assert len({r.timestamp_ms for r in moved}) == len(moved)
    bursts, line = load_replication(SimWorkloadOptions(limit=200, arrival_clock_ms=1000, arrival_seed=2,
                                                       arrival_spread="order"), WorkloadShape(), 0)
    assert "arrive together" in line and all(r.timestamp_ms % 1000 == 0 for r in bursts)


def test_a_fan_out_puts_each_tick_inside_its_first_milliseconds_of_the_replay():
    from kvmesh.cluster.commands.sim import load_replication
    from kvmesh.cluster.measure.sim.options import SimWorkloadOptions
    from kvmesh.cluster.measure.workloads.settings import WorkloadShape

    def fanned(seed, time_scale=0.5):
        w = SimWorkloadOptions(limit=200, arrival_clock_ms=1000, arrival_seed=seed, arrival_spread="fanout",
                               fanout_ms=4.0)
        return load_replication(w, WorkloadShape(), 0, time_scale)

    bursts, _ = load_replication(SimWorkloadOptions(limit=200, arrival_clock_ms=1000, arrival_seed=3,
                                                    arrival_spread="order"), WorkloadShape(), 0)
    moved, line = fanned(3)
    assert "within 4 ms" in line and "arrival seed 3" in line
    # 4 ms of a replay at --time-scale 0.5 is 8 ms of the trace: every request within 8 ms of its tick's start
    assert all(0 <= r.timestamp_ms % 1000 < 8 for r in moved)
    assert Counter((r.hash_ids, r.timestamp_ms // 1000) for r in moved) == \
        Counter((r.hash_ids, r.timestamp_ms // 1000) for r in bursts)
    assert [r.timestamp_ms for r in moved] == sorted(r.timestamp_ms for r in moved)
    assert len({r.timestamp_ms for r in moved}) == len(moved)  # no two at one instant
    assert fanned(3)[0] == moved and fanned(4)[0] != moved
    assert max(r.timestamp_ms % 1000 for r in fanned(3, time_scale=1.0)[0]) < 4


@pytest.mark.parametrize("bad", [{"arrival_clock_ms": 0}, {"arrival_clock_ms": -5.0}, {"arrival_spread": "shuffle"},
                                 {"fanout_ms": 0}, {"fanout_ms": float("nan")}])
def test_a_bad_clock_or_spread_is_refused_by_name(bad):
    from kvmesh.cluster.measure.sim.options import SimWorkloadOptions

    with pytest.raises(ValueError, match=next(iter(bad))):
        SimWorkloadOptions(**bad)
