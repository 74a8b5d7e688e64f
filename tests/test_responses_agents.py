"""The OpenAI Agents SDK runs a two-tool agent against a kvmesh router over the Responses API to completion.

The SDK lives in its own virtualenv, outside the repository (it pins its own openai client): its python is
``$KVMESH_AGENTS_PYTHON``, else ``../peers/agents-venv/bin/python`` beside the checkout; the test skips, saying so,
where neither has ``openai-agents`` (``python -m venv agents-venv && agents-venv/bin/pip install openai-agents``).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from . import responses_cluster
from .responses_cluster import TENANT_KEYS

cluster = responses_cluster.cluster  # the fixture
HERE = Path(__file__).resolve().parent
AGENTS_PYTHON = os.environ.get("KVMESH_AGENTS_PYTHON") or str(HERE.parent.parent / "peers" / "agents-venv" / "bin"
                                                             / "python")


def agents_python() -> str:
    """The SDK's python, or a skip saying where it was looked for."""
    try:
        found = subprocess.run([AGENTS_PYTHON, "-c", "import agents"], capture_output=True, timeout=60).returncode == 0
    except OSError:
        found = False
    if not found:
        pytest.skip(f"openai-agents is not installed for {AGENTS_PYTHON} (set KVMESH_AGENTS_PYTHON to a python "
                    "that has it)")
    return AGENTS_PYTHON


def test_a_two_tool_agent_runs_to_completion(cluster):
    python = agents_python()
    router = cluster.router
    run = subprocess.run([python, str(HERE / "agents_two_tools.py"), router.url + "/v1", TENANT_KEYS["ann"]],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    results = [json.loads(line) for line in run.stdout.strip().splitlines()[-2:]]
    assert [result["chained"] for result in results] == [False, True]
    for result in results:
        assert result["called"] and set(result["called"]) <= {"get_weather", "get_time"}
        assert "tool_call_item" in result["items"] and "tool_call_output_item" in result["items"]
        assert result["items"][-1] == "message_output_item" and isinstance(result["final_output"]["sunny"], bool)
    chained = router.responses.store.get("ann", results[1]["previous_response_id"])  # the chained run's last turn
    assert chained is not None and chained.response["previous_response_id"] is not None
