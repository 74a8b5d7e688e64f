"""``kvmesh bench live_verdict``: the routers in front of a fleet of emulated replicas whose context is longer than
the tokenizer's own (stories260K's 512 tokens; the replicas serve 8,192), every request served by every router."""

from __future__ import annotations

import json

import pytest
from kvmesh.cluster.measure.benchmarks.live_verdict import main
from kvmesh.cluster.measure.loadgen.live_compare import _line
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
    assert _line(row).endswith("cached   0.0%  no TTFT  errors 24")


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
