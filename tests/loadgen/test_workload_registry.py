"""Every registered workload runs in ``kvmesh bench load``, with the prefix structure it has in the simulator."""

from __future__ import annotations

from pathlib import Path

import pytest
from kvmesh.cluster.measure.loadgen.load import build_parser, build_sessions, main, run_async
from kvmesh.cluster.measure.loadgen.options import BenchLoadConfig, WorkloadOptions
from kvmesh.cluster.measure.sim.options import default_trace
from kvmesh.cluster.measure.workloads.prompts import PromptMaker, join
from kvmesh.cluster.measure.workloads.registry import WORKLOADS, get_workload, workload_names
from kvmesh.cluster.measure.workloads.settings import WorkloadShape


def _args(url, *extra):
    return build_parser().parse_args(["--url", url, "--no-progress", "--no-plot", *extra])


@pytest.mark.parametrize("name", workload_names())
async def test_every_registered_workload_runs_against_an_endpoint(name, fake_server):
    trace = get_workload(name).trace_file
    if trace and not Path(default_trace(trace)).is_file():
        pytest.skip(f"{name} reads {default_trace(trace)}, which is not here (../shared/traces)")
    run = await run_async(_args(fake_server.url, "--workload", name, "--num-requests", "4", "--turns", "2",
                                "--max-prompt-tokens", "64", "--max-tokens", "2", "--concurrency", "2"))
    s = run["summary"]
    assert s["errors"] == 0 and s["ok"] == (8 if name == "multi_turn" else 4)
    assert all(0 < len(b["prompt"]) <= 64 for b in fake_server.state.requests)


def test_unknown_workload_names_the_registered_ones(capsys):
    rc = main(["--url", "http://127.0.0.1:9", "--workload", "chat_bot", "--no-progress", "--no-plot"])
    err = capsys.readouterr().err
    assert rc == 2 and "'chat_bot'" in err and all(name in err for name in WORKLOADS)


def test_help_lists_the_registry_like_kvmesh_sim(capsys):
    from kvmesh.cluster.cli import main as kvmesh

    listed = {}
    for argv in (["sim", "--help"], ["bench", "load", "--help"]):
        with pytest.raises(SystemExit):
            kvmesh(argv)
        tail = capsys.readouterr().out.split("workloads (--workload")[1]
        listed[argv[0]] = [line.split()[0] for line in tail.splitlines()[1:] if line.startswith("  ")]
    assert listed["sim"] == listed["bench"] == list(workload_names())


def _config(name: str, shape: WorkloadShape | None = None, **workload) -> BenchLoadConfig:
    return BenchLoadConfig(workload=WorkloadOptions(workload=name, **workload),
                           shape=shape or BenchLoadConfig().shape)


def test_multi_turn_sessions_are_the_simulators_conversations_rendered():
    maker = PromptMaker()
    w = WorkloadOptions(workload="multi_turn", num_requests=3, max_prompt_tokens=128, max_tokens=8)
    shape = WorkloadShape(num_prefixes=4, turns=3)
    entry = get_workload("multi_turn")
    records = entry.make(w.settings(entry, shape))
    rendering = w.rendering(entry, maker, as_text=False)
    sessions = build_sessions(_config("multi_turn", shape, num_requests=3, max_prompt_tokens=128, max_tokens=8),
                              maker)
    assert [s.session_id for s in sessions] == ["conv-0", "conv-1", "conv-2"]
    for session in sessions:
        turns = [r for r in records if r.session_id == session.session_id]
        assert len(turns) == len(session.turns) == 3
        sent: list[int] = list(session.turns[0].system)
        for record, turn in zip(turns, session.turns, strict=True):
            sent += turn.user  # turn k's messages so far are exactly record k's blocks: k extends k-1
            assert sent == join(rendering.blocks(record), False)
        assert len(session.turns[0].system) == 16 * turns[0].system_blocks == 32


def test_chatbot_prompt_is_the_system_blocks_plus_a_question_and_replays_keep_trace_time():
    sessions = build_sessions(_config("chatbot", WorkloadShape(num_prefixes=2), num_requests=6,
                                      max_prompt_tokens=64), PromptMaker())
    assert {len(s.turns[0].system) for s in sessions} == {48} and {len(s.turns[0].user) for s in sessions} == {16}
    assert len({tuple(s.turns[0].system) for s in sessions}) == 2 and all(s.arrival_s is None for s in sessions)
    agents = build_sessions(_config("tool_agent", num_requests=8, time_scale=0.5), PromptMaker())
    times = [s.arrival_s for s in agents]
    assert times[0] == 0.0 and times == sorted(times) and all(len(s.turns) == 1 for s in agents)


@pytest.mark.parametrize("name", ["chatbot", "rag", "multi_turn"])
async def test_chat_sends_the_shared_blocks_as_the_system_message(name, fake_server):
    run = await run_async(_args(fake_server.url, "--workload", name, "--api", "chat", "--prompt-format", "text",
                                "--num-requests", "3", "--turns", "2", "--max-prompt-tokens", "160",
                                "--max-tokens", "2"))
    assert run["summary"]["errors"] == 0
    firsts = [b["messages"] for b in fake_server.state.requests if len(b["messages"]) == 2]
    assert len(firsts) == 3 and all([m["role"] for m in msgs] == ["system", "user"] for msgs in firsts)
