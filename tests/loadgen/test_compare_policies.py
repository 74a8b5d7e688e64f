"""compare-policies runs every workload against every endpoint and writes one side-by-side report."""

from __future__ import annotations

import json

from kvmesh.cluster.measure.loadgen.compare import main


def test_compare_two_endpoints_side_by_side(make_fake_server, tmp_path, capsys):
    a, b = make_fake_server(), make_fake_server()
    out = tmp_path / "cmp.json"
    rc = main(["--endpoint", f"alpha={a.url}", "--endpoint", f"beta={b.url}", "--workloads", "chatbot,multi_turn",
               "--num-requests", "4", "--turns", "2", "--max-prompt-tokens", "64", "--max-tokens", "2",
               "--out", str(out), "--no-progress"])
    assert rc == 0
    summaries = json.loads(out.read_text())["summaries"]
    assert set(summaries) == {"alpha", "beta"}
    assert all(set(per) == {"chatbot", "multi_turn"} for per in summaries.values())
    assert summaries["alpha"]["chatbot"]["ok"] == 4 and summaries["beta"]["multi_turn"]["ok"] == 8
    assert (tmp_path / "cmp_chatbot.png").exists() and (tmp_path / "cmp_multi_turn.png").exists()
    # each run has its own cache salt, so runs never share cache entries
    salts = {body["cache_salt"] for body in a.state.requests}
    assert len(salts) == 2
    assert "alpha chatbot" in capsys.readouterr().out


def test_compare_without_replicas_fails_clearly(tmp_path, capsys):
    rc = main(["--url", "http://127.0.0.1:9", "--out", str(tmp_path / "x.json"), "--no-progress"])
    assert rc == 2
    assert "cannot list replicas" in capsys.readouterr().err


def test_compare_starts_one_router_per_policy_in_front_of_the_same_replicas(make_fake_server, tmp_path, stories_path):
    a, b = make_fake_server(), make_fake_server()
    out = tmp_path / "policies.json"
    rc = main(["--replica", f"{a.url},name=a", "--replica", f"{b.url},name=b", "--policies",
               "cache_aware,round_robin", "--workloads", "chatbot", "--router-model", str(stories_path),
               "--num-requests", "4", "--max-prompt-tokens", "64", "--max-tokens", "2", "--settle", "0",
               "--out", str(out), "--no-progress", "--no-plot"])
    assert rc == 0
    summaries = json.loads(out.read_text())["summaries"]
    assert set(summaries) == {"cache_aware", "round_robin"}
    assert all(per["chatbot"]["ok"] == 4 for per in summaries.values())
    assert len(a.state.requests) + len(b.state.requests) == 8
