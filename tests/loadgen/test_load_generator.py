"""The load generator against a fake OpenAI SSE server: workloads, loops, metrics, outputs."""

from __future__ import annotations

import json

from kvmesh.cluster.measure.loadgen.load import build_parser, main, run_async


def _args(url, *extra):
    return build_parser().parse_args(["--url", url, "--no-progress", "--no-plot", *extra])


async def test_chatbot_closed_loop_measures_latency_and_cached_share(fake_server):
    run = await run_async(_args(fake_server.url, "--workload", "chatbot", "--num-requests", "12",
                                "--num-prefixes", "1", "--max-prompt-tokens", "64", "--max-tokens", "4"))
    s = run["summary"]
    assert (s["requests"], s["ok"], s["errors"]) == (12, 12, 0)
    assert s["ttft_s"]["p50"] > 0 and s["e2e_s"]["p99"] >= s["ttft_s"]["p99"]
    assert s["itl_s"]["p50"] is not None and s["completion_tokens"] == 12 * 4
    # 48 of 64 prompt tokens are the shared system prompt = 3 full blocks: cached after the first requests
    assert 0.5 < s["cached_token_share"] <= 0.75
    body = fake_server.state.requests[0]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert isinstance(body["prompt"], list) and len(body["prompt"]) == 64


async def test_multi_turn_history_grows_and_stays_in_budget(fake_server):
    run = await run_async(_args(fake_server.url, "--workload", "multi_turn", "--num-requests", "3",
                                "--turns", "3", "--max-prompt-tokens", "128", "--max-tokens", "8"))
    assert run["summary"]["ok"] == 9
    by_session: dict[str, list] = {}
    for body in fake_server.state.requests:
        by_session.setdefault(tuple(body["prompt"][:50]), []).append(body["prompt"])
    for prompts in by_session.values():
        for earlier, later in zip(prompts, prompts[1:], strict=False):
            assert later[: len(earlier)] == earlier and len(later) > len(earlier)
        assert len(prompts[-1]) <= 128
    assert run["summary"]["cached_token_share"] > 0.3


async def test_chat_api_sends_real_answers_back(fake_server):
    run = await run_async(_args(fake_server.url, "--workload", "multi_turn", "--api", "chat",
                                "--prompt-format", "text", "--num-requests", "2", "--turns", "2",
                                "--max-prompt-tokens", "200", "--max-tokens", "3"))
    assert run["summary"]["ok"] == 4
    second = [b for b in fake_server.state.requests if len(b["messages"]) > 2][0]
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "user"]
    assert second["messages"][2]["content"] == " w0 w1 w2"


async def test_open_loop_poisson_and_rag(fake_server):
    run = await run_async(_args(fake_server.url, "--workload", "rag", "--mode", "open", "--rate", "200",
                                "--num-requests", "10", "--max-prompt-tokens", "80", "--max-tokens", "2"))
    starts = [r["start_s"] for r in run["requests"]]
    assert run["summary"]["ok"] == 10 and max(starts) > 0.0


async def test_mooncake_replay_keeps_prefixes_and_scales_time(fake_server, mooncake_trace):
    run = await run_async(_args(fake_server.url, "--workload", "mooncake", "--trace", str(mooncake_trace),
                                "--num-requests", "6", "--mode", "open", "--time-scale", "0.001",
                                "--concurrency", "0", "--max-prompt-tokens", "96", "--max-tokens", "2"))
    assert run["summary"]["ok"] == 6
    assert all(len(b["prompt"]) <= 96 for b in fake_server.state.requests)


async def test_server_errors_are_counted_not_fatal(make_fake_server):
    srv = make_fake_server(fail_every=3)
    run = await run_async(_args(srv.url, "--num-requests", "9", "--max-prompt-tokens", "32",
                                "--max-tokens", "2", "--concurrency", "1"))
    s = run["summary"]
    assert (s["ok"], s["errors"]) == (6, 3)
    assert "injected failure" in s["error_samples"][0] and "HTTP 400" in s["error_samples"][0]


def test_cli_writes_json_and_plot(fake_server, tmp_path):
    out = tmp_path / "load.json"
    rc = main(["--url", fake_server.url, "--num-requests", "4", "--max-prompt-tokens", "32",
               "--max-tokens", "2", "--out", str(out), "--no-progress"])
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["summary"]["ok"] == 4 and len(data["requests"]) == 4
    assert out.with_suffix(".png").stat().st_size > 1000


async def test_azure_replay_uses_trace_lengths_within_budget(fake_server, tmp_path):
    trace = tmp_path / "azure.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                     "2023-11-16 18:15:46.0000000,40,3\n2023-11-16 18:15:46.0100000,4000,900\n")
    run = await run_async(_args(fake_server.url, "--workload", "azure", "--trace", str(trace), "--mode", "open",
                                "--max-prompt-tokens", "64", "--max-tokens", "5"))
    assert run["summary"]["ok"] == 2
    sizes = sorted((len(b["prompt"]), b["max_tokens"]) for b in fake_server.state.requests)
    assert sizes == [(40, 3), (64, 5)]


async def test_tool_agent_replays_the_simulators_generated_trace(fake_server):
    run = await run_async(_args(fake_server.url, "--workload", "tool_agent", "--num-requests", "12",
                                "--max-prompt-tokens", "512", "--max-tokens", "2"))
    assert run["summary"]["ok"] == 12
    prompts = [b["prompt"] for b in fake_server.state.requests]
    # branches of one step share the agent's whole trajectory: long common prefixes, served from cache
    assert run["summary"]["cached_token_share"] > 0.5 and all(len(p) <= 512 for p in prompts)
