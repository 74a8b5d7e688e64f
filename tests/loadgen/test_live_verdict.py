"""``kvmesh bench live_verdict``: the routers in front of a fleet of emulated replicas whose context is longer than
the tokenizer's own (stories260K's 512 tokens; the replicas serve 8,192), every request served by every router."""

from __future__ import annotations

import json

import pytest
from kvmesh.cluster.measure.benchmarks.live_verdict import main
from kvmesh.cluster.measure.loadgen.live_compare import round_line
from kvmesh.cluster.measure.loadgen.live_routers import LiveFleet, find_peer, peers_dir, router_command
from kvmesh.router.config import ReplicaSpec


def test_kvmesh_router_is_given_the_replicas_context(tmp_path):
    """Without it the router's tokenizer (the model's 512) would refuse prompts the replicas take."""
    fleet = LiveFleet((ReplicaSpec("http://127.0.0.1:1", events="tcp://127.0.0.1:2"),), "/m", "stories", 16, 8192)
    cmd = router_command("kvmesh", fleet, tmp_path)
    assert cmd[cmd.index("--max-model-len") + 1] == "8192"
    no_context = LiveFleet(fleet.replicas, "/m", "stories", 16)
    assert "--max-model-len" not in router_command("kvmesh", no_context, tmp_path)


def test_a_run_whose_every_request_failed_prints_a_line_not_a_traceback():
    row = {"round": 0, "workload": "chatbot", "router": "kvmesh", "summary": {
        "cached_token_share": 0.0, "errors": 24, "ttft_s": {"mean": None, "p50": None}}}
    assert round_line(row).endswith("cached   0.0%  no TTFT  errors 24")


@pytest.mark.live
def test_every_router_serves_prompts_past_the_tokenizers_context_on_an_emulated_fleet(tmp_path, capsys):
    routers = ["kvmesh", *(p for p in ("sglang-router",) if find_peer(p, peers_dir(None)))]
    out = tmp_path / "verdict.json"
    rc = main(["--replicas", "2", "--num-requests", "6", "--rate", "4", "--max-prompt-tokens", "768",
               "--max-tokens", "4", "--num-kv-blocks", "128", "--dilation", "1", "--rounds", "1",
               "--routers", ",".join(routers), "--work", str(tmp_path / "work"), "--no-plot", "--out", str(out)])
    assert rc == 0, capsys.readouterr()
    result = json.loads(out.read_text())
    assert result["command"].startswith("kvmesh bench live_verdict --replicas 2")
    per = result["stats"]["chatbot"]
    assert list(per) == routers
    assert all(s["errors"] == 0 and s["requests"] == 6 for s in per.values())
    prompt_tokens = [r["summary"]["prompt_tokens"] / r["summary"]["requests"] for r in result["rows"]]
    assert min(prompt_tokens) > 512  # past stories260K's own context: the router was given the replicas'
    emulation = result["fleet"]["emulation"]
    assert len(emulation) == 2 and all(r["num_steps"] > 0 and r["late_s_p99"] >= 0 for r in emulation)


def _row(rnd: int, router: str, ttfts: list, cached: float, counts: list, ceiling: float | None = None) -> dict:
    ok = sorted(t for t in ttfts if t is not None)
    row = {"round": rnd, "router": router, "workload": "chatbot", "ttft_s": ttfts,
           "replicas": [{"requests": c} for c in counts],
           "summary": {"cached_token_share": cached, "errors": ttfts.count(None),
                       "ttft_s": {"mean": sum(ok) / len(ok), "p50": ok[len(ok) // 2], "p99": ok[-1]},
                       "e2e_s": {"mean": 2 * sum(ok) / len(ok)}}}
    return row | ({"ceiling": {"hit_rate": ceiling, "miss_tokens": {}}} if ceiling is not None else {})


def test_the_verdict_table_is_in_the_gpus_time_and_pairs_each_round_with_kvmesh():
    """Dilation 4: a 3.6 s live TTFT is 0.9 s on the emulated GPU, within chatbot's 1 s target; 4.8 s is not. A
    failed request counts against goodput."""
    from kvmesh.cluster.measure.benchmarks.support.live_verdict_table import table, verdict_stats

    rows = [_row(0, "kvmesh", [3.6, 3.6, 4.8, 4.8], 0.7, [2, 2], ceiling=0.75),
            _row(0, "peer", [3.6, 4.8, 4.8, None], 0.5, [4, 0]),
            _row(1, "kvmesh", [3.6, 3.6, 3.6, 4.8], 0.7, [2, 2], ceiling=0.75),
            _row(1, "peer", [4.8, 4.8, 4.8, 4.8], 0.5, [3, 1])]
    result = {"stats": {"chatbot": {"kvmesh": {}, "peer": {}}}, "rows": rows, "fleet": {"dilation": 4.0, "rate": 2.5}}
    v = verdict_stats(result)
    kv, peer = v["routers"]["kvmesh"], v["routers"]["peer"]
    assert v["slo_s"] == 1.0 and v["ceiling"] == (0.75, 0.0)
    assert kv["good_share"][0] == pytest.approx((0.5 + 0.75) / 2)
    assert peer["good_share"][0] == pytest.approx((0.25 + 0.0) / 2) and peer["errors"] == 1
    assert peer["busiest"][0] == pytest.approx((2.0 + 1.5) / 2)
    assert peer["vs_reference"]["hit_points"][0] == pytest.approx(20.0)
    assert peer["vs_reference"]["good_points"][0] == pytest.approx(50.0)
    assert kv["ttft_mean_s"][0] == pytest.approx((4.2 + 3.9) / 2 / 4)
    text = table([result])
    assert "| chatbot, 2.5/s | **kvmesh** | 70.0 ± 0.0% (75.0 ± 0.0%) |" in text
    assert "| chatbot, 2.5/s | peer | 50.0 ± 0.0% |" in text


def test_kvmesh_routers_ceiling_and_a_replicas_counters_are_read_from_their_metrics(monkeypatch):
    from kvmesh.cluster.measure.loadgen import live_routers
    from kvmesh.cluster.measure.loadgen.live_compare import router_ceiling

    text = ("# TYPE kvmesh_router_ceiling_hit_ratio gauge\nkvmesh_router_ceiling_hit_ratio 0.31\n"
            "# TYPE kvmesh_router_prompt_miss_tokens counter\n"
            'kvmesh_router_prompt_miss_tokens_total{kind="routed_away"} 16.0\n'
            'kvmesh_router_prompt_miss_tokens_total{kind="no_reuse"} 36.0\n'
            "# TYPE vllm:prefix_cache_hits counter\n"
            'vllm:prefix_cache_hits_total{model_name="m",engine="0"} 5.0\n'
            'vllm:prefix_cache_hits_total{model_name="m",engine="1"} 2.0\n')
    monkeypatch.setattr(live_routers, "_call", lambda url, key, method="GET": (200, text))
    assert router_ceiling("http://x") == {"hit_rate": 0.31, "miss_tokens": {"routed_away": 16.0, "no_reuse": 36.0}}
    counts = live_routers.replica_counters((ReplicaSpec("http://x"),), None)
    assert counts == [{"requests": 0.0, "prefix_cache_queries": 0.0, "prefix_cache_hits": 7.0}]


def test_the_time_between_tokens_is_in_the_gpus_time_and_unknown_where_the_client_saw_no_stream():
    """Dilation 4: a live p99 of 2.8 s is 0.7 s of the GPU's; an arm whose rows carry no per-request TTFTs (Dynamo's,
    whose stream carries no text until its end) shows "-", not a figure its client could not see."""
    from kvmesh.cluster.measure.benchmarks.support.live_verdict_itl import table

    rows = []
    for rnd, p99 in ((0, 2.8), (1, 2.8)):
        rows.append(_row(rnd, "kvmesh", [3.6, 4.8], 0.7, [1, 1]))
        rows[-1]["summary"]["itl_s"] = {"p50": 0.04, "p90": 0.1, "p99": p99}
        rows.append(_row(rnd, "dynamo", [1.0, 1.0], 0.5, []) | {"ttft_s": None})
    late = {"late_s_p50": 1e-4, "late_s_p99": 0.008, "cpu_s_per_step": 3e-4}
    fleet = {"dilation": 4.0, "rate": 2.5, "emulation": [late, late | {"cpu_s_per_step": 4e-4}],
             "cost": {"prefill_s_per_token": 0.0025, "step_overhead_s": 0.01}, "max_num_batched_tokens": 256}
    result = {"rows": rows, "settings": {"workload": "chatbot", "max_prompt_tokens": 1024}, "fleet": fleet}
    text = table([result])
    assert "| chatbot, 2.5/s | kvmesh | 10 ± 0 ms | 25 ± 0 ms | 0.70 ± 0.00 s |" in text
    assert "| chatbot, 2.5/s | dynamo | - | - | - |" in text
    assert "| chatbot, 2.5/s | 2.60 s | 0.1 ms | 8.0 ms | 2.0 ms | 0.30-0.40 ms |" in text  # 2.56 + 4 steps


def test_one_whole_prefill_is_the_simulators_ttft_of_the_longest_prompt_on_an_idle_fleet():
    """The timing table's yardstick, from the profile a results file records, is what the simulator makes of the
    longest prompt alone on that profile: its own run, not the formula restated."""
    from kvmesh.cluster.measure.benchmarks.support.live_verdict_itl import whole_prefill_s
    from kvmesh.cluster.measure.sim.emulated_check import requests, simulate

    (longest,) = requests(1, 1024, 1)
    run = simulate([longest], 1, "round_robin", 0, 1.0)
    assert whole_prefill_s(run, 1024) == pytest.approx(run["ttft_s"]["mean"], rel=1e-6)


def test_the_shortfall_lists_a_real_router_where_kvmesh_misses_the_line_and_bolds_the_missed_figure():
    """The line: cached share higher beyond the paired interval, mean TTFT lower by more than 2% beyond it. A peer
    that caches as much (-0 points) is listed with its hits in bold; one kvmesh beats on both is not; round-robin is a
    baseline, never listed."""
    from kvmesh.cluster.measure.benchmarks.support.live_verdict_shortfall import table as shortfall

    rows = []
    for rnd in (0, 1):
        rows += [_row(rnd, "kvmesh", [1.0, 1.0], 0.7, [1, 1]), _row(rnd, "level", [2.0, 2.0], 0.7, [2, 0]),
                 _row(rnd, "beaten", [2.0, 2.0], 0.5, [1, 1]), _row(rnd, "round_robin", [1.0, 1.0], 0.7, [1, 1]),
                 _row(rnd, "near", [1.01, 1.01], 0.5, [1, 1])]
    result = {"stats": {"chatbot": dict.fromkeys(("kvmesh", "level", "beaten", "round_robin", "near"), {})},
              "rows": rows, "fleet": {"dilation": 4.0, "rate": 2.5}}
    text = shortfall([result])
    assert "| chatbot, 2.5/s | level | **+0.0 ± 0.0** | -50 ± 0% |" in text
    assert "| chatbot, 2.5/s | near | +20.0 ± 0.0 | **-1 ± 0%** |" in text  # lower, but by less than 2%
    assert "beaten" not in text and "round_robin" not in text
