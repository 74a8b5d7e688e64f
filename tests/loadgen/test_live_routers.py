"""``kvmesh bench compare-policies --router``: kvmesh's router and the real vllm-router / sglang-router, each a
process of its own in front of the same ``kvmesh replica``s, on reset prefix caches, over interleaved rounds.

The peers are not kvmesh dependencies: install them into virtualenvs outside the repository (``python3 -m venv
../peers/vllm && ../peers/vllm/bin/pip install vllm-router``, the same for sglang-router) or point
``KVMESH_PEERS_DIR`` at the folder that holds them; the live test skips, saying so, when none is there.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from kvmesh.cluster.measure.loadgen.compare import main
from kvmesh.cluster.measure.loadgen.live_compare import stats, table
from kvmesh.cluster.measure.loadgen.live_replicas import launched_replicas
from kvmesh.cluster.measure.loadgen.live_routers import (
    LiveFleet,
    find_peer,
    peers_dir,
    replica_counters,
    reset_prefix_caches,
    router_command,
)
from kvmesh.router.config import ReplicaSpec

FLEET = LiveFleet((ReplicaSpec("http://127.0.0.1:1", events="tcp://127.0.0.1:2", replay="tcp://127.0.0.1:3"),
                   ReplicaSpec("http://127.0.0.1:4", events="tcp://127.0.0.1:5")), "/m", "stories", 16)


def _fake_peers(tmp_path: Path) -> Path:
    for venv, exe in (("v", "vllm-router"), ("s", "sglang-router")):
        (tmp_path / venv / "bin").mkdir(parents=True)
        (tmp_path / venv / "bin" / exe).write_text("")
    return tmp_path


def test_kvmesh_router_is_fed_every_replicas_event_and_replay_sockets(tmp_path):
    cmd = router_command("kvmesh", FLEET, tmp_path)
    assert cmd[1:4] == ["-m", "kvmesh.cluster.cli", "router"] and "--policy" not in cmd
    assert [cmd[i + 1] for i, x in enumerate(cmd) if x == "--replica"] == [
        "http://127.0.0.1:1,events=tcp://127.0.0.1:2,replay=tcp://127.0.0.1:3",
        "http://127.0.0.1:4,events=tcp://127.0.0.1:5"]
    assert router_command("kvmesh:round_robin", FLEET, tmp_path)[-2:] == ["--policy", "round_robin"]
    knobbed = router_command("kvmesh:cache_aware_tokens@queue_share_weight=0.3@churn_clamp=3", FLEET, tmp_path)
    assert knobbed[-5:] == ["--policy", "cache_aware_tokens", "--policy-kwargs", "queue_share_weight=0.3",
                            "churn_clamp=3"]
    flagged = router_command("kvmesh:cache_aware_tokens@backlog_weight=1@--no-admission-enabled", FLEET, tmp_path)
    assert flagged[-5:] == ["--policy", "cache_aware_tokens", "--policy-kwargs", "backlog_weight=1",
                            "--no-admission-enabled"]


def test_peers_run_cache_aware_at_their_defaults_and_kv_aware_reads_the_events(tmp_path):
    folder = _fake_peers(tmp_path)
    sglang = router_command("sglang-router", FLEET, folder)
    assert sglang[:2] == [str(folder / "s/bin/sglang-router"), "launch"]
    assert sglang[sglang.index("--policy") + 1] == "cache_aware" and "--cache-threshold" not in sglang
    vllm = router_command("vllm-router", FLEET, folder)
    assert vllm[vllm.index("--policy") + 1] == "cache_aware" and "--kv-event-source" not in vllm
    kv = router_command("vllm-router:kv_aware", FLEET, folder)
    assert kv[kv.index("--policy") + 1] == "kv_aware"
    assert [kv[i + 1] for i, x in enumerate(kv) if x == "--kv-event-source"] == [
        "http://127.0.0.1:1=tcp://127.0.0.1:2", "http://127.0.0.1:4=tcp://127.0.0.1:5"]
    assert [kv[i + 1] for i, x in enumerate(kv) if x == "--kv-event-replay-source"] == [
        "http://127.0.0.1:1=tcp://127.0.0.1:3"]
    assert kv[kv.index("--kv-event-model") + 1] == "stories" and kv[kv.index("--kv-event-block-size") + 1] == "16"


def test_a_missing_peer_or_an_unknown_router_is_named(tmp_path):
    with pytest.raises(ValueError, match=rf"sglang-router is not installed: no {tmp_path}/\*/bin/sglang-router"):
        router_command("sglang-router", FLEET, tmp_path)
    with pytest.raises(ValueError, match="--router must be one of .*; got 'nginx'"):
        router_command("nginx", FLEET, tmp_path)
    with pytest.raises(ValueError, match="takes NAME=VALUE knobs or --flags; got 'queue_share_weight'"):
        router_command("kvmesh:cache_aware_tokens@queue_share_weight", FLEET, tmp_path)
    with pytest.raises(ValueError, match="names its policy before its knobs"):
        router_command("kvmesh:@queue_share_weight=1", FLEET, tmp_path)


def _row(rnd: int, router: str, hit: float, ttft: float) -> dict:
    summary = {"cached_token_share": hit, "ttft_s": {"mean": ttft, "p50": ttft}, "errors": 0, "requests": 10}
    replicas = [{"requests": 6.0}, {"requests": 4.0}]  # the busiest replica took 1.2 x the mean
    return {"round": rnd, "router": router, "workload": "w", "summary": summary, "replicas": replicas}


def test_kvmesh_against_a_peer_is_a_paired_difference_round_by_round():
    rows = [_row(0, "kvmesh", 0.5, 0.10), _row(0, "p", 0.4, 0.20), _row(1, "kvmesh", 0.3, 0.30),
            _row(1, "p", 0.2, 0.30)]
    s = stats(rows, ["kvmesh", "p"], ["w"])["w"]
    assert s["kvmesh"]["hit_rate"][0] == pytest.approx(0.4) and s["p"]["requests"] == 20
    vs = s["p"]["vs_reference"]
    assert vs["hit_points"] == pytest.approx((10.0, 0.0))  # 10 points ahead in both rounds: no spread
    assert vs["ttft_mean_ratio"][0] == pytest.approx((0.10 / 0.20 - 1 + 0.0) / 2)
    assert vs["ttft_mean_ratio"][1] == pytest.approx(12.706 * (0.5 / 2 ** 0.5) / 2 ** 0.5)  # t(1) x sd / sqrt(n)
    assert "vs_reference" not in s["kvmesh"] and s["p"]["load_imbalance"] == pytest.approx((1.2, 0.0))
    lines = table({"stats": {"w": s}}).splitlines()
    assert lines[2].startswith("| w | **kvmesh** | 40.0 ± 127.1% |")
    assert "| +10.0 ± 0.0 |" in lines[3] and "| 1.20 ± 0.00 |" in lines[3]


def _peers() -> list[str]:
    folder = peers_dir(None)
    found = [name for name in ("vllm-router", "sglang-router") if find_peer(name, folder)]
    if not found:
        pytest.skip(f"no peer router installed in {folder} (see this file's docstring; KVMESH_PEERS_DIR moves it)")
    return found


def _cached(url: str, model: str, prompt: str) -> int:
    r = httpx.post(url + "/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 1}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


@pytest.mark.live
def test_a_reset_leaves_the_replicas_nothing_to_reuse_and_their_counters_show_it(stories_path):
    prompt = "Once upon a time there was a little girl who loved to play in the park with her dog. " * 3
    with launched_replicas(1, str(stories_path), "--kv-cache-memory 1MiB") as fleet:
        url, model = fleet.replicas[0].url, fleet.served_model_name
        _cached(url, model, prompt)
        assert _cached(url, model, prompt) > 0
        hits = replica_counters(fleet.replicas, None)[0]["prefix_cache_hits"]
        reset_prefix_caches(fleet.replicas, None)
        assert _cached(url, model, prompt) == 0
        counters = replica_counters(fleet.replicas, None)[0]
        assert counters["requests"] == 3 and counters["prefix_cache_hits"] == hits > 0


@pytest.mark.live
def test_kvmesh_and_the_installed_peers_replay_one_trace_on_the_same_replicas(stories_path, tmp_path, capsys):
    """The short version of BENCHMARKS' live comparison: every router serves every request of the trace."""
    routers = ["kvmesh", *_peers()]
    out = tmp_path / "live.json"
    rc = main([*(x for r in routers for x in ("--router", r)), "--launch-replicas", "2", "--router-model",
               str(stories_path), "--replica-args", "--kv-cache-memory 1MiB", "--workloads", "azure_conv",
               "--num-requests", "24", "--trace-block-tokens", "64", "--time-scale", "0.25", "--mode", "open",
               "--prompt-format", "text", "--max-tokens", "4", "--rounds", "1", "--settle", "0.5",
               "--out", str(out), "--no-progress", "--no-plot"])
    assert rc == 0, capsys.readouterr()
    result = json.loads(out.read_text())
    assert result["command"].startswith("kvmesh bench compare-policies --router kvmesh")
    per = result["stats"]["azure_conv"]
    assert list(per) == routers
    assert all(s["errors"] == 0 and s["requests"] == 24 for s in per.values())
    assert per["kvmesh"]["hit_rate"][0] > 0  # the trace's shared tenant prefixes were reused
    assert all("vs_reference" in per[r] for r in routers[1:])
    assert "| azure_conv | **kvmesh** |" in capsys.readouterr().out
