"""Dynamo's arm of the live verdict: the step times its mocker is given are kvmesh's cost model's, its rounds go into
the verdict's results file beside the other routers', and, where Dynamo is installed in the peers' folder, a live
round through its frontend and mocker workers answers every request with cached tokens counted."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest
from kvmesh.cluster.measure.benchmarks.live_verdict_dynamo import add_rows, load_argv
from kvmesh.cluster.measure.benchmarks.support.dynamo_fleet import decode_ms, model_dir, write_profile
from kvmesh.replica.emulate.cost_model import CostModel

COST = CostModel(prefill_s_per_token=1 / 375, decode_s_per_context_token=1.25e-6)


@pytest.mark.parametrize(("seqs", "context"), [(1, 16), (4, 256), (32, 1024), (100, 64)])
def test_a_steps_decode_time_is_the_cost_models(seqs, context):
    """A step decoding ``seqs`` sequences of ``context`` tokens each: the mocker's decode time plus its prefill time
    for the step's new tokens is what kvmesh's emulated replica waits for the same step."""
    cost = asdict(COST)
    for new_tokens in (0, 200):
        mocker_s = decode_ms(cost, seqs * context, context) / 1000 + cost["prefill_s_per_token"] * new_tokens
        assert mocker_s == pytest.approx(COST.step_time(new_tokens, seqs, seqs * context))


def test_the_profile_holds_the_cost_model_at_its_points(tmp_path):
    np = pytest.importorskip("numpy")
    cost = asdict(COST)
    data = np.load(write_profile(cost, tmp_path / "p.npz"))
    assert data["prefill_ttft_ms"].tolist() == pytest.approx([1000 * n / 375 for n in data["prefill_isl"]])
    itl = data["decode_itl"]
    assert itl.shape == (len(data["decode_active_kv_tokens"]), len(data["decode_context_length"]))
    i, j = list(data["decode_active_kv_tokens"]).index(4096), list(data["decode_context_length"]).index(512)
    assert itl[i, j] == pytest.approx(1000 * COST.step_time(0, 8, 4096))


def test_the_models_copy_gets_a_chat_template_and_links_the_rest(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>"}))
    (model / "tokenizer.json").write_text("{}")
    out = model_dir(model, tmp_path / "work")
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["bos_token"] == "<s>" and "messages" in config["chat_template"]
    assert (out / "tokenizer.json").is_symlink()
    assert "chat_template" not in json.loads((model / "tokenizer_config.json").read_text())  # the original untouched


def _row(rnd: int, router: str, ttft: float, counts: list) -> dict:
    return {"round": rnd, "router": router, "workload": "chatbot", "ttft_s": [ttft, ttft],
            "replicas": [{"requests": c} for c in counts],
            "summary": {"cached_token_share": 0.5, "errors": 0, "requests": 2,
                        "ttft_s": {"mean": ttft, "p50": ttft, "p99": ttft}, "e2e_s": {"mean": ttft + 1}}}


def test_dynamos_rounds_replace_its_earlier_ones_and_show_in_the_table():
    from kvmesh.cluster.measure.benchmarks.support.live_verdict_table import table

    verdict = {"settings": {"workload": "chatbot"}, "fleet": {"dilation": 4.0, "rate": 2.5},
               "stats": {"chatbot": {"kvmesh": {}, "dynamo": {}}},
               "rows": [_row(0, "kvmesh", 2.0, [1, 1]), _row(0, "dynamo", 9.0, [])]}
    verdict["rows"].append(_row(1, "kvmesh", 2.0, [1, 1]))
    out = add_rows(verdict, [_row(0, "dynamo", 4.0, []), _row(1, "dynamo", 4.0, [])],
                   "kvmesh bench live_verdict_dynamo --verdict v.json", "1.6.1")
    assert [r["router"] for r in out["rows"]] == ["kvmesh", "kvmesh", "dynamo", "dynamo"]
    dynamo = out["stats"]["chatbot"]["dynamo"]
    assert dynamo["ttft_mean_s"] == (4.0, 0.0) and dynamo["load_imbalance"] is None  # no counters: no spread
    assert out["dynamo"] == {"dynamo": {"command": "kvmesh bench live_verdict_dynamo --verdict v.json",
                                        "version": "1.6.1", "rounds": 2}}
    rr = add_rows(out, [{**_row(0, "dynamo:round-robin", 8.0, [])}], "... --router-mode round-robin", "1.6.1")
    assert list(rr["stats"]["chatbot"]) == ["kvmesh", "dynamo", "dynamo:round-robin"]  # another arm, kept apart
    assert list(rr["dynamo"]) == ["dynamo", "dynamo:round-robin"]
    assert "| chatbot, 2.5/s | dynamo | 50.0 ± 0.0% | 1.00 ± 0.00 s | 1.00 ± 0.00 s | 1.00 ± 0.00 s | " \
        "1.25 ± 0.00 s | 100 ± 0% | - |" in table([out])


def test_dynamos_ttft_is_its_routers_mean_and_its_percentiles_are_not_claimed():
    """The mocker's tokens decode to no text, so the client's first chunk is the last: the row's TTFT is the
    router's histogram mean, and what a histogram cannot give exactly (p50, p99, goodput) is shown as unknown."""
    from kvmesh.cluster.measure.benchmarks.live_verdict_dynamo import router_timed_row
    from kvmesh.cluster.measure.benchmarks.support.dynamo_fleet import ttft_totals
    from kvmesh.cluster.measure.benchmarks.support.live_verdict_table import table

    page = ("# TYPE dynamo_component_router_time_to_first_token_seconds histogram\n"
            'dynamo_component_router_time_to_first_token_seconds_bucket{worker_id="a",le="10"} 1\n'
            'dynamo_component_router_time_to_first_token_seconds_sum{worker_id="a"} 4.0\n'
            'dynamo_component_router_time_to_first_token_seconds_count{worker_id="a"} 1\n'
            'dynamo_component_router_time_to_first_token_seconds_sum{worker_id="b"} 2.0\n'
            'dynamo_component_router_time_to_first_token_seconds_count{worker_id="b"} 1\n'
            'dynamo_frontend_time_to_first_token_seconds_sum{model="m"} 0\n'
            'dynamo_frontend_inter_token_latency_seconds_sum{model="m"} 99\n')
    assert ttft_totals(page) == {"sum": 6.0, "count": 2.0}
    client = _row(0, "dynamo", 9.0, [])
    row = router_timed_row(0, "dynamo", "chatbot", {"summary": client["summary"], "requests": [
        {"ttft_s": 9.0, "ok": True}, {"ttft_s": 9.0, "ok": True}]}, ttft_totals(page))
    assert row["summary"]["ttft_s"]["mean"] == 3.0 and row["summary"]["client_ttft_s"]["mean"] == 9.0
    verdict = {"settings": {"workload": "chatbot"}, "fleet": {"dilation": 1.0, "rate": 2.5},
               "stats": {"chatbot": {"kvmesh": {}}}, "rows": [_row(0, "kvmesh", 2.0, [1, 1])]}
    out = add_rows(verdict, [row], "cmd", "1.6.1")
    assert "| chatbot, 2.5/s | dynamo | 50.0 ± 0.0% | 3.00 ± 0.00 s | - | - | 10.00 ± 0.00 s | - | - | +0.0 ± 0.0 | " \
        "-33 ± 0% | - |" in table([out])  # end-to-end: the client's, whose last chunk is the last


def test_the_load_is_the_verdicts():
    settings = {"workload": "mooncake", "num_prefixes": 8, "num_requests": 160, "max_prompt_tokens": 1024,
                "max_tokens": 64, "rate": 1.75, "tokens_per_word": 2.36, "seed": 0}
    argv = load_argv(settings)
    assert argv[argv.index("--rate") + 1] == "1.75" and argv[argv.index("--tokens-per-word") + 1] == "2.36"
    assert argv[argv.index("--prompt-format") + 1] == "text"


@pytest.mark.live
def test_a_round_through_dynamos_router_and_mocker_workers(tmp_path, capsys):
    from kvmesh.cluster.measure.benchmarks.live_verdict_dynamo import main
    from kvmesh.cluster.measure.loadgen.live_routers import peers_dir

    if not (peers_dir(None) / "dynamo" / "bin" / "python").exists():
        pytest.skip(f"Dynamo is not installed at {peers_dir(None) / 'dynamo'} (docs/benchmarks/live-verdict.md)")
    verdict = {"rounds": 1, "settings": {"workload": "chatbot", "num_prefixes": 2, "num_requests": 6,
                                         "max_prompt_tokens": 256, "max_tokens": 4, "rate": 4.0,
                                         "tokens_per_word": 2.36, "seed": 0},
               "fleet": {"replicas": 2, "num_kv_blocks": 128, "dilation": 1.0, "rate": 4.0},
               "stats": {"chatbot": {}}, "rows": []}
    path = tmp_path / "v.json"
    path.write_text(json.dumps(verdict))
    assert main(["--verdict", str(path), "--work", str(tmp_path / "work"), "--no-plot"]) == 0, capsys.readouterr()
    out = json.loads(path.read_text())
    (row,) = out["rows"]
    assert row["router"] == "dynamo" and row["summary"]["errors"] == 0 and row["summary"]["requests"] == 6
    assert row["summary"]["ttft_s"]["count"] == 6 and row["summary"]["ttft_s"]["mean"] > 0  # the router's own
    assert row["summary"]["cached_token_share"] > 0  # the two tenants' system prompts, found by its KV router
    assert out["dynamo"]["dynamo"]["version"] != "unknown"
    assert row["cpu_s"]["workers"] > 0 and row["cpu_s"]["frontend"] > 0 and row["cpu_s"]["wall"] > 0
