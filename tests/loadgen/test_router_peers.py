"""``kvmesh bench router-peers``: its stub replica, its workloads, and how it finds peer routers."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import httpx
import pytest
from kvmesh.cluster.cli import main
from kvmesh.cluster.measure.benchmarks import router_peers


@pytest.fixture(scope="module")
def stub():
    proc = subprocess.Popen([sys.executable, "-m", "kvmesh.cluster.measure.benchmarks.support.fake_replica"],
                            stdout=subprocess.PIPE, text=True)
    try:
        yield f"http://127.0.0.1:{json.loads(proc.stdout.readline())['port']}"
    finally:
        proc.terminate()
        proc.wait(10)


def test_router_peers_is_reachable_with_a_hyphen(capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "router-peers", "--help"])
    assert e.value.code == 0
    assert "side by side" in capsys.readouterr().out


def test_stub_answers_completions_chat_and_streams_over_one_connection(stub):
    with httpx.Client(base_url=stub, timeout=5) as client:
        completion = client.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 1}).json()
        chat = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}).json()
        streamed = client.post("/v1/completions", json={"prompt": "x", "stream": True})
        load = client.get("/load").json()
    assert completion["choices"][0]["text"] == "!" and chat["choices"][0]["message"]["content"] == "!"
    assert streamed.headers["content-type"] == "text/event-stream"
    assert streamed.text.endswith("data: [DONE]\n\n")
    assert load["num_requests_running"] == 0


def test_stub_reads_chunked_request_bodies(stub):
    body = iter([b'{"prompt": "x", ', b'"stream": true}'])  # a generator body goes out chunked
    r = httpx.post(stub + "/v1/completions", content=body, timeout=5)
    assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")


def test_workloads_resend_growing_chat_histories_and_same_prompts_as_ids(stories_path):
    from kvmesh.replica.serving.tokenizer import load_tokenizer

    tok = load_tokenizer(stories_path, max_model_len=8192)
    bodies = {w: [json.loads(b) for b in items] for w, items in router_peers.workloads(tok).items()}
    assert len(bodies["text"]) == len(bodies["token_ids"]) == 512
    assert bodies["token_ids"][5]["prompt"] == tok.encode(bodies["text"][5]["prompt"])
    assert 960 <= len(bodies["token_ids"][0]["prompt"]) <= 1000  # "1,000-token" prompts
    first, later = bodies["chat"][0]["messages"], bodies["chat"][32]["messages"]  # one chat, turns 1 and 2
    assert later[: len(first)] == first and len(later) == len(first) + 2


def test_missing_peers_are_skipped_with_a_reason_and_installed_ones_found(tmp_path):
    exe = tmp_path / "sglang" / "bin" / "sglang-router"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\n")
    args = SimpleNamespace(model="m", workers=1, peers_dir=str(tmp_path))
    found, skipped = router_peers.router_commands(args, ["http://127.0.0.1:1"], "t.jinja")
    assert found["sglang-router"][:2] == [str(exe), "launch"]
    assert "vllm-router" in skipped and str(tmp_path) in skipped["vllm-router"]
    assert set(found) == {"kvmesh", "kvmesh-no-tokenize-cache", "kvmesh-no-admission", "sglang-router"}
    assert found["kvmesh-no-admission"] == [*found["kvmesh"], "--no-admission-enabled"]


def test_the_table_has_a_row_per_router_run_and_names_a_refused_workload():
    """BENCHMARKS' table is generated from the results file (kvmesh bench report's router_peers kind)."""
    fig = {"cpu_ms_per_request": 0.2314, "requests_per_s": 4314.2, "added_p50_ms": 0.391, "added_p99_ms": 0.524,
           "failed_requests": 0}
    summary = {"kvmesh": {"text": fig, "token_ids": fig}, "kvmesh-no-admission": {"text": fig, "token_ids": fig},
               "kvmesh-2-workers": {"text": fig, "token_ids": fig},
               "sglang-router": {"text": fig, "token_ids": {"unsupported": "9 of 9 requests failed"}}}
    lines = router_peers.table({"summary": summary, "workloads": {"text": [], "token_ids": []}}).splitlines()
    assert lines[2] == "| **kvmesh** | **0.231** (4,314/s; +0.39 / 0.52 ms) | **0.231** (4,314/s; +0.39 / 0.52 ms) |"
    assert lines[3] == ("| kvmesh, admission off (`--no-admission-enabled`) | 0.231 (4,314/s; +0.39 ms) "
                        "| 0.231 (4,314/s; +0.39 ms) |")
    assert lines[4].startswith("| kvmesh `--workers 2` (both on core 0) | 0.231 (4,314/s; +0.39 ms) |")
    assert lines[5] == "| sglang-router | 0.231 (4,314/s; +0.39 / 0.52 ms) | rejects token-id prompts (400) |"
