"""A live cluster of stories260K replicas changed under traffic, one Ray for the session.

Module order: scale up by the admin API, a rolling restart of those 2 replicas under constant load, then drain
one of them with streams in flight (so one scale-up serves both); then a second cluster whose autoscaler follows a
load that rises and stops.
Every load is bounded (threads with a deadline) and every request must succeed.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest

from .fleet_load import Load
from .live_cluster import admin_headers, fleet_idle, start_cluster, wait_fleet

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(ray_session, stories_path, tmp_path_factory):
    serve = start_cluster(stories_path, tmp_path_factory, "fleet")
    yield serve
    serve.stop()


def _run_past(load: Load, t: float, timeout_s: float = 60.0) -> None:
    """Until ``load`` has completed a request at or after ``t`` (monotonic): every window of its
    outcomes that ends by ``t`` is complete (``Outcome.at`` is when a request ended)."""
    deadline = time.monotonic() + timeout_s
    while not any(o.at >= t for o in list(load.outcomes)):
        assert time.monotonic() < deadline, (f"the load completed nothing after {t:.1f} ({len(load.outcomes)} "
                                             f"requests, {len(load.failures)} failed)")
        time.sleep(0.1)


def _warm(load: Load, timeout_s: float = 120.0) -> float:
    """Until the load's last ``families`` requests all had cached tokens (every prefix family cached
    on the replica it is routed to); when that was seen (monotonic)."""
    deadline = time.monotonic() + timeout_s
    while True:
        last = list(load.outcomes)[-load.families:]
        if len(last) == load.families and all(o.ok and o.cached_tokens > 0 for o in last):
            return time.monotonic()
        assert time.monotonic() < deadline, f"the load's prefixes never got cached: {last}"
        time.sleep(0.1)


def test_admin_key_file_is_private(cluster):
    assert cluster.admin_key_file.stat().st_mode & 0o777 == 0o600
    assert json.loads(cluster.admin_key_file.read_text())["url"] == cluster.url
    assert httpx.post(cluster.url + "/admin/scale", json={"replicas": 2}, timeout=10).status_code == 403


def test_kvmesh_drain_of_the_last_replica_is_refused_and_it_keeps_serving(cluster, monkeypatch, capsys):
    from kvmesh.cluster.cli import main

    (only,) = [h.replica_id for h in cluster.state.replicas]
    monkeypatch.setenv("KVMESH_CLUSTERS_DIR", str(cluster.admin_key_file.parent))
    monkeypatch.delenv("KVMESH_ADMIN_KEY", raising=False)
    assert main(["drain", only, "--url", cluster.url]) == 1
    err = capsys.readouterr().err
    assert "router answered 409" in err and "last replica" in err and "kvmesh scale 2" in err, err
    state = httpx.get(cluster.url + "/admin/fleet", headers=admin_headers(cluster), timeout=10).json()
    assert state["replicas"] == [only] and state["target"] == 1 and fleet_idle(state)
    assert httpx.get(cluster.url + "/health", timeout=10).json()["healthy_replicas"] == [only]  # not draining


def test_scale_to_two_through_the_admin_api(cluster):
    r = httpx.post(cluster.url + "/admin/scale", json={"replicas": 2}, headers=admin_headers(cluster), timeout=10)
    assert r.status_code == 200 and r.json()["accepted"], r.text
    state = wait_fleet(cluster, lambda s: fleet_idle(s) and len(s["replicas"]) == 2, 180, "2 replicas")
    assert state["operations"][-1]["outcome"] == "ok"
    health = httpx.get(cluster.url + "/health", timeout=10).json()
    assert sorted(health["healthy_replicas"]) == sorted(state["replicas"])
    too_many = httpx.post(cluster.url + "/admin/scale", json={"replicas": 9}, headers=admin_headers(cluster),
                          timeout=10)
    assert too_many.status_code == 400 and "cannot scale to 9" in too_many.json()["error"]["message"]
    # the session's Ray has RAY_NUM_CPUS = 8 logical CPUs and a replica takes 1 (capacity.py's count)
    assert "allowed 1..8 (what the Ray cluster's nodes hold" in too_many.json()["error"]["message"]


@pytest.mark.timeout(600)  # three replica starts in a row: ~130 s on 2 idle cores, near 300 on busy ones
def test_rolling_restart_under_constant_load_fails_nothing_and_the_hit_rate_recovers(cluster):
    # Long by nature: a rollout starts its 2 new replicas one after the other (each a fresh Ray worker importing torch
    # and transformers), and the hit rate is measured for 5 s before it and 8 s after it.
    httpx.post(cluster.url + "/admin/scale", json={"replicas": 2}, headers=admin_headers(cluster), timeout=10)
    wait_fleet(cluster, lambda s: fleet_idle(s) and len(s["replicas"]) == 2, 180, "2 replicas")
    before = {h.actor._actor_id.hex() for h in cluster.state.replicas}
    names_before = {h.replica_id for h in cluster.state.replicas}
    load = Load(cluster.url, cluster.state.served_model_name, clients=3, max_tokens=16).start()
    try:
        _run_past(load, _warm(load) + 5)  # the 5 s the hit rate before is measured on: all warm
        bad = httpx.post(cluster.url + "/admin/rollout", json={"engine": {"max_num_seq": 32}},
                         headers=admin_headers(cluster), timeout=10)
        assert bad.status_code == 400 and "max_num_seq" in bad.json()["error"]["message"], bad.text
        t_start = time.monotonic()
        r = httpx.post(cluster.url + "/admin/rollout", json={"engine": {"max_num_seqs": 32}},
                       headers=admin_headers(cluster), timeout=10)
        assert r.status_code == 200 and r.json()["engine_changes"] == ["max_num_seqs"], r.text
        again = httpx.post(cluster.url + "/admin/rollout", json={}, headers=admin_headers(cluster), timeout=10)
        assert again.status_code == 409 and "already running" in again.json()["error"]["message"], again.text
        state = wait_fleet(cluster, lambda s: fleet_idle(s) and s["operations"][-1]["operation"] == "rollout", 300,
                            "the rollout")
        t_end = time.monotonic()
        _run_past(load, t_end + 10)  # the window the hit rate after is measured on (t_end + 2 .. t_end + 10)
    finally:
        outcomes = load.stop()
    assert state["operations"][-1]["outcome"] == "ok"
    after_actors = {h.actor._actor_id.hex() for h in cluster.state.replicas}
    assert not after_actors & before and len(after_actors) == len(state["replicas"]) == 2
    assert not names_before & set(state["replicas"]), "a new replica took an old one's name (and its metrics)"
    assert cluster.state.engine.max_num_seqs == 32  # what the new replicas were started with
    assert not load.failures, load.failures[:3]

    def hit_rate(lo, hi):
        window = [o for o in outcomes if lo <= o.at < hi]
        return sum(o.cached_tokens for o in window) / max(1, sum(o.prompt_tokens for o in window))

    before_rate, after = hit_rate(t_start - 5, t_start), hit_rate(t_end + 2, t_end + 10)
    recovered = next((t for t in range(0, 60) if hit_rate(t_end + t, t_end + t + 2) >= 0.9 * before_rate), None)
    print(f"\nrollout of 2 replicas: {t_end - t_start:.1f}s, {len(outcomes)} requests, 0 failed; hit rate "
          f"{before_rate:.0%} before, {after:.0%} after; back to 90% of before {recovered}s after the rollout ended")
    assert after >= 0.8 * before_rate, (before_rate, after)


def test_drain_lets_streams_in_flight_finish_then_removes_the_replica(cluster):
    load = Load(cluster.url, cluster.state.served_model_name, clients=4, max_tokens=96).start()
    try:
        deadline = time.monotonic() + 60
        busy = None
        while busy is None and time.monotonic() < deadline:
            rows = httpx.get(cluster.url + "/replicas", headers=admin_headers(cluster), timeout=10).json()["replicas"]
            busy = next((r["id"] for r in rows if r["in_flight"] > 0), None)
        assert busy, "no request in flight"
        r = httpx.post(f"{cluster.url}/replicas/{busy}/drain", headers=admin_headers(cluster), timeout=10)
        assert r.status_code == 200 and r.json()["in_flight"] > 0 and r.json()["will_be_removed"], r.text
        assert r.json()["target"] == 1, r.text  # a drain lowers the target for good, and says so
        wait_fleet(cluster, lambda s: fleet_idle(s) and busy not in s["replicas"], 120, f"{busy} removed")
    finally:
        outcomes = load.stop()
    assert outcomes and not load.failures, load.failures[:3]
    assert any(f"{busy} drained" in m and "0 request(s) in flight" not in m for m in cluster.messages)
    index = cluster.state.router.runtime.router.index
    assert busy not in index.replica_ids and busy not in cluster.state.router.runtime.replicas


@pytest.fixture(scope="module")
def autoscaled(ray_session, stories_path, tmp_path_factory, cluster):
    record = cluster.admin_key_file
    cluster.stop()  # one cluster at a time on this machine
    assert not record.exists(), "a stopped cluster's admin key record stays behind"
    serve = start_cluster(stories_path, tmp_path_factory, "autoscale", autoscale={
        "scale_with_load": True, "min_replicas": 1, "max_replicas": 3, "target_in_flight": 2,
        "upscale_delay_s": 1, "downscale_delay_s": 3, "decision_interval_s": 0.25})
    yield serve
    serve.stop()


@pytest.mark.timeout(600)  # up to three replicas and back: ~70 s on 2 idle cores, past 300 on busy ones
def test_autoscaler_follows_load_up_to_three_and_back_to_one(autoscaled, monkeypatch, capsys):
    cluster = autoscaled
    t0 = time.monotonic()
    load = Load(cluster.url, cluster.state.served_model_name, clients=8, max_tokens=48).start()
    try:
        wait_fleet(cluster, lambda s: len(s["replicas"]) == 3 and fleet_idle(s), 240, "3 replicas")
    finally:
        load.stop()
    t_up = time.monotonic()
    trickle = Load(cluster.url, cluster.state.served_model_name, clients=1, max_tokens=64).start()
    try:
        state = wait_fleet(cluster, lambda s: len(s["replicas"]) == 1 and fleet_idle(s), 240, "back to 1 replica")
    finally:
        trickle.stop()
    with capsys.disabled():
        print(f"\nautoscaler: 1 -> 3 replicas in {t_up - t0:.1f}s under 8 clients ({len(load.outcomes)} requests), "
              f"3 -> 1 in {time.monotonic() - t_up:.1f}s under 1 client ({len(trickle.outcomes)} requests); "
              + "; ".join(m for m in cluster.messages if "drained" in m))
    assert load.outcomes and trickle.outcomes
    assert not load.failures and not trickle.failures, (load.failures + trickle.failures)[:3]
    actions = [d["action"] for d in state["decisions"]]
    assert "up" in actions and actions.count("down") == 2, state["decisions"]
    assert all(d["victim"] for d in state["decisions"] if d["action"] == "down")
    runtime = cluster.state.router.runtime
    assert {r.id for r in runtime.replicas} == set(state["replicas"]) == set(map(str, runtime.router.index.replica_ids))
    metrics = httpx.get(cluster.url + "/metrics", timeout=10).text
    assert 'kvmesh_autoscaler_decisions_total{action="down"} 2.0' in metrics
    from kvmesh.cluster.cli import main

    monkeypatch.setenv("KVMESH_CLUSTERS_DIR", str(cluster.admin_key_file.parent))
    monkeypatch.delenv("KVMESH_ADMIN_KEY", raising=False)
    capsys.readouterr()
    assert main(["status", "--url", cluster.url]) == 0
    out = capsys.readouterr().out
    assert "fleet: 1 replicas, target 1, autoscale 1..3" in out and "decision: down 2 -> 1" in out, out
