"""Every registered workload runs in ``kvmesh sim``, and an unknown name's error lists the registry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kvmesh.cluster.cli import main
from kvmesh.cluster.measure.sim.options import default_trace
from kvmesh.cluster.measure.workloads.registry import WORKLOADS, get_workload, workload_names
from kvmesh.cluster.measure.workloads.settings import WorkloadSettings, WorkloadShape


def _needs_shared_trace(name: str) -> None:
    trace = get_workload(name).trace_file
    if trace and not Path(default_trace(trace)).is_file():
        pytest.skip(f"{name} reads {default_trace(trace)}, which is not here (../shared/traces)")


@pytest.mark.parametrize("name", workload_names())
def test_every_registered_workload_runs_in_the_simulator(name, tmp_path):
    _needs_shared_trace(name)
    out = tmp_path / "sim.json"
    rc = main(["sim", "--workload", name, "--num-requests", "40", "--limit", "40", "--max-prompt-blocks", "16",
               "--num-replicas", "2", "--blocks-per-replica", "256", "--miniature", "16", "--policies", "cache_aware",
               "--no-ceilings", "--no-plot", "--no-progress", "--out", str(out)])
    assert rc == 0
    assert json.loads(out.read_text())["policies"]["cache_aware"]["num_requests"] == 40


def test_synthetic_is_the_multi_turn_workload(tmp_path):
    runs = {}
    for flags in (["--synthetic", "30"], ["--workload", "multi_turn", "--num-requests", "30"]):
        out = tmp_path / f"{len(runs)}.json"
        assert main(["sim", *flags, "--num-replicas", "2", "--blocks-per-replica", "256", "--miniature", "16",
                     "--policies", "cache_aware",
                     "--no-ceilings", "--no-plot", "--no-progress", "--out", str(out)]) == 0
        run = json.loads(out.read_text())["policies"]["cache_aware"]
        runs[flags[0]] = {k: run[k] for k in ("num_requests", "prompt_tokens", "cached_tokens", "hit_rate")}
    assert runs["--synthetic"] == runs["--workload"] and runs["--synthetic"]["num_requests"] == 30


def test_unknown_workload_names_the_registered_ones(tmp_path, capsys):
    assert main(["sim", "--workload", "chat_bot", "--out", str(tmp_path / "o.json"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "'chat_bot'" in err and all(name in err for name in WORKLOADS)
    with pytest.raises(ValueError, match="workload must be one of mooncake, "):
        get_workload("chat_bot")


@pytest.mark.parametrize("name", ["chatbot", "multi_turn", "rag", "random", "tool_agent"])
def test_generated_records_are_sorted_sized_and_in_sessions(name):
    recs = get_workload(name).make(WorkloadSettings(num_requests=60, prompt_tokens=4096, shape=WorkloadShape(turns=3),
                                                    seed=2))
    assert len(recs) == 60 and [r.timestamp_ms for r in recs] == sorted(r.timestamp_ms for r in recs)
    assert all(0 < r.input_length <= 512 * len(r.hash_ids) for r in recs)
    assert all(r.session_id for r in recs)


def test_multi_turn_turns_extend_the_previous_turn_and_keep_the_system_prompt():
    recs = get_workload("multi_turn").make(WorkloadSettings(
        num_requests=30, prompt_tokens=8192, shape=WorkloadShape(turns=3, num_prefixes=2)))
    by_session: dict[str, list] = {}
    for r in recs:
        by_session.setdefault(r.session_id, []).append(r)
    for turns in by_session.values():
        assert turns[0].system_blocks == 4  # a quarter of 16 blocks
        for a, b in zip(turns, turns[1:], strict=False):
            assert b.hash_ids[: len(a.hash_ids)] == a.hash_ids and len(b.hash_ids) > len(a.hash_ids)
    assert len({r.hash_ids[:4] for r in recs}) == 2  # two tenants


def test_chatbot_and_rag_share_their_system_blocks():
    chat = get_workload("chatbot").make(WorkloadSettings(num_requests=50, prompt_tokens=2048,
                                                         shape=WorkloadShape(num_prefixes=3)))
    assert {r.system_blocks for r in chat} == {3} and len({r.hash_ids[:3] for r in chat}) == 3
    assert len({r.hash_ids[3:] for r in chat}) == 50  # unique questions
    rag = get_workload("rag").make(WorkloadSettings(num_requests=20, prompt_tokens=5120,
                                                    shape=WorkloadShape(num_documents=2)))
    assert len({r.hash_ids[:2] for r in rag}) == 1 and len({r.hash_ids[:-1] for r in rag}) == 2


def test_the_simulators_workload_flags_default_to_the_registrys_settings():
    from kvmesh.cluster.measure.sim.options import SimCommandConfig, SimWorkloadOptions

    command = SimCommandConfig()
    assert command.workload.settings(3, command.shape) == WorkloadSettings(rate=1.0, seed=3)
    shaped = SimWorkloadOptions(workload="chatbot", num_requests=10, prompt_tokens=2048).settings(
        0, WorkloadShape(num_prefixes=2))
    chat = get_workload("chatbot").make(shaped)
    assert len(chat) == 10 and len({r.hash_ids[:3] for r in chat}) == 2
