"""The README's agent loop (the OpenAI Agents SDK, one function tool, through chat completions) against ``kvmesh
serve`` started as the README's quick start starts it: the forced first call runs the tool, the later ones leave
``tool_choice`` to the server ("auto") and end in an answer, with no flag added.

The SDK lives in its own virtualenv (tests/test_responses_agents.py says where); without it the test skips."""

from __future__ import annotations

import ast
import subprocess

import pytest

from .docs_commands import blocks
from .test_docs_commands_live import guide_cluster, on_port
from .test_responses_agents import agents_python

__all__ = ["guide_cluster"]  # the fixture, shared with the other guide tests


def readme_agent_block() -> str:
    found = [block for block in blocks() if block.kind == "live" and "from agents import" in block.text]
    assert [block.path for block in found] == ["README.md"], [block.where for block in found]
    return found[0].text


@pytest.fixture(scope="module")
def agents() -> str:
    """The SDK's python, found (or the skip) before ``guide_cluster`` starts a ``kvmesh serve`` for nothing."""
    return agents_python()


def test_the_readmes_agent_loop_runs_as_written(agents, guide_cluster, tmp_path):
    python = agents
    port, env = guide_cluster
    script = tmp_path / "agent.py"
    script.write_text(on_port(readme_agent_block(), port))
    run = subprocess.run([python, str(script)], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    items = ast.literal_eval(run.stdout.strip().splitlines()[-1].split("]")[0] + "]")
    assert items[:2] == ["tool_call_item", "tool_call_output_item"] and items[-1] == "message_output_item", items
