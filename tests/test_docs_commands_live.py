"""The guides' ``live`` blocks (curl, the OpenAI client, ``kvmesh bench load``) against ``kvmesh serve`` of the
embedded model, started here as the README's quick start starts it (tests/docs_commands.py has the markers)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from .docs_commands import blocks, command_environment, curl_checked, run_command, words

BIN = Path(sys.executable).parent
COMMAND_TIMEOUT_S = 180
"""A guide's command here takes seconds; bench compare-policies, the longest, ran past 60 s once with the machine busy
with other test processes."""
SERVE_READY_TIMEOUT_S = 120
WORKLOAD_CUT = {"KVMESH_WORKLOAD_NUM_REQUESTS": "8", "KVMESH_WORKLOAD_MAX_TOKENS": "8"}
"""``kvmesh bench load`` and ``compare-policies`` send 8 requests of 8 tokens (their defaults 64 of 32: compare-policies
alone sent 768 through the CPU replicas), as their guide says its tests run them."""
GUIDE_PORT = 8000
"""The router port the guides' commands name (127.0.0.1:8000, localhost:8000); the test's serve takes a free one
and the commands are pointed at it."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def on_port(text: str, port: int) -> str:
    return re.sub(rf"\b(127\.0\.0\.1|localhost):{GUIDE_PORT}\b", rf"\g<1>:{port}", text)


def test_commands_are_pointed_at_the_tests_port():
    assert on_port("curl localhost:8000/v1/x http://127.0.0.1:8000/v1 :80001", 9) == \
        "curl localhost:9/v1/x http://127.0.0.1:9/v1 :80001"
    assert curl_checked("curl -N http://x") == "curl -sS -f -N http://x"


@pytest.fixture(scope="module")
def guide_cluster(tmp_path_factory):
    """``kvmesh serve`` with no model, as the README's quick start runs it, on a free port of 127.0.0.1 (its
    replicas' ports free too): (port, environment for the commands). Stopped as Ctrl-C stops it."""
    if shutil.which("curl") is None:
        pytest.skip("the guides' live blocks use curl, which this machine lacks")
    home = tmp_path_factory.mktemp("serve")
    port = _free_port()
    env = command_environment(BIN, KVMESH_CLUSTERS_DIR=str(home / "clusters"), KVMESH_CACHE_DIR=str(home / "cache"),
                              KVMESH_RESULTS_DIR=str(home / "results"), **WORKLOAD_CUT)
    env.pop("RAY_ADDRESS", None)
    log_path = home / "serve.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen([str(BIN / "kvmesh"), "serve", "--host", "127.0.0.1", "--port", str(port),
                                 "--http-port", "0", "--event-port", "0"], cwd=home, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + SERVE_READY_TIMEOUT_S
        while "kvmesh is ready" not in log_path.read_text():
            assert proc.poll() is None, "kvmesh serve exited:\n" + log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, (f"kvmesh serve not ready in {SERVE_READY_TIMEOUT_S}s:\n"
                                                 + log_path.read_text()[-3000:])
            time.sleep(0.5)
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).status_code == 200
        yield port, env
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C, as the quick start stops it
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def test_the_workload_cut_the_benches_run_with_is_the_one_their_guide_names():
    guide = (Path(__file__).resolve().parent.parent / "docs" / "benchmarks-and-simulator.md").read_text()
    assert all(f"`{name}=N`" in guide for name in WORKLOAD_CUT)
    assert len(set(WORKLOAD_CUT.values())) == 1 and f"send {WORKLOAD_CUT['KVMESH_WORKLOAD_MAX_TOKENS']} of " \
        f"{WORKLOAD_CUT['KVMESH_WORKLOAD_MAX_TOKENS']})" in guide


def test_live_blocks_against_kvmesh_serve(guide_cluster, tmp_path):
    """Every ``live`` block, in the guides' order, against one ``kvmesh serve``: each command exits 0, each curl
    gets a 2xx."""
    port, env = guide_cluster
    live = [block for block in blocks() if block.kind == "live"
            # the agent loop: tests/test_readme_agent_loop.py, in the SDK's venv
            and "from agents import" not in block.text]
    assert live, "no live block in the guides"
    ran, skipped = [], []
    for block in live:
        if block.language == "python":
            if "openai" in block.text and importlib.util.find_spec("openai") is None:
                skipped.append(f"{block.where} (needs the openai package)")
                continue
            script = tmp_path / f"{block.path.replace('/', '_')}_{block.line}.py"
            script.write_text(on_port(block.text, port))
            run_command(f"{sys.executable} {script}", block.where, tmp_path, env, COMMAND_TIMEOUT_S)
        else:
            for command in block.commands():
                command = on_port(command, port)
                run_command(curl_checked(command) if words(command)[0] == "curl" else command, block.where,
                            tmp_path, env, COMMAND_TIMEOUT_S)
        ran.append(block.where)
    if skipped:
        pytest.skip("ran " + ", ".join(ran) + "; skipped " + ", ".join(skipped))
