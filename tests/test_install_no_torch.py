"""kvmesh's wheel installed without extras in a fresh venv gives a working router without torch, Ray or transformers.

The wheel is built from this checkout; its dependencies come from the configured package index
(pip's cache and find-links make that quick). The router then serves a real request in front of a
stub replica written here with the standard library only.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parent.parent
NETWORK_ERRORS = ("NewConnectionError", "Max retries exceeded", "Temporary failure in name resolution",
                  "Network is unreachable", "Connection refused")


class StubReplica(BaseHTTPRequestHandler):
    """The least an OpenAI replica answers: /health, /v1/models, a non-streaming /v1/completions."""

    seen: list[dict] = []

    def _json(self, status: int, body: dict) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.path == "/health":
            self._json(200, {"status": "ok"})
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": "stub", "object": "model"}]})
        else:
            self._json(404, {"error": {"message": "not here", "type": "not_found", "code": 404}})

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        StubReplica.seen.append(body)
        self._json(200, {"id": "cmpl-1", "object": "text_completion", "model": body.get("model"),
                         "choices": [{"index": 0, "text": " from the stub", "finish_reason": "length"}],
                         "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}})

    def log_message(self, *args):
        pass


def _run(*argv, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout)


LISTENING = re.compile(r"kvmesh-router listening on http://127\.0\.0\.1:(\d+)")
"""The router's line once it serves (router/control/router_server.py), with the port it bound."""


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("no-torch")
    source, wheel_dir = root / "src", root / "wheel"  # build from a copy: the checkout gets no build/
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO_ROOT / name, source / name)
    for layer in ("kvcache", "events", "replica", "router", "cluster"):
        shutil.copytree(REPO_ROOT / layer, source / layer, ignore=shutil.ignore_patterns("__pycache__"))
    built = _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", wheel_dir,
                 source)
    assert built.returncode == 0, built.stderr
    (wheel,) = wheel_dir.glob("kvmesh-*.whl")
    # a venv without pip of its own (ensurepip installs pip from its bundled wheel: most of this fixture's time);
    # this pip installs into it (--python), resolving the wheel's own requirements in that interpreter, and leaves
    # the .pyc files to be written as the router imports its modules
    _run(sys.executable, "-m", "venv", "--without-pip", root / "venv").check_returncode()
    pip = _run(sys.executable, "-m", "pip", "--python", root / "venv" / "bin" / "python", "install", "-q",
               "--no-compile", "--disable-pip-version-check", wheel)
    if pip.returncode != 0 and any(e in pip.stdout + pip.stderr for e in NETWORK_ERRORS):
        pytest.skip(f"the package index cannot be reached: {pip.stderr.strip().splitlines()[-1]}")
    assert pip.returncode == 0, pip.stderr
    return root / "venv"


def test_the_core_install_has_no_torch_ray_transformers_or_nixl(venv):
    probe = ("import importlib.util as u; "
             "print([m for m in ('torch', 'ray', 'transformers', 'nixl') if u.find_spec(m)])")
    assert _run(venv / "bin" / "python", "-c", probe).stdout.strip() == "[]"


def test_router_help_and_version_work_without_torch(venv):
    helped = _run(venv / "bin" / "kvmesh", "router", "--help", timeout=60)
    assert helped.returncode == 0 and "--replica" in helped.stdout and "--policy-kwargs" in helped.stdout
    version = _run(venv / "bin" / "kvmesh", "--version", timeout=60)
    assert version.returncode == 0 and version.stdout.startswith("kvmesh 0.")


def test_routed_request_reaches_a_replica_without_torch(venv):
    stub = ThreadingHTTPServer(("127.0.0.1", 0), StubReplica)
    threading.Thread(target=stub.serve_forever, daemon=True).start()
    # --port 0: the router binds a port of its own and says which (a port picked here could be bound by another
    # test's process before the router starts, and answered by it)
    router = subprocess.Popen([str(venv / "bin" / "kvmesh"), "router", "--port", "0", "--served-model-name",
                               "stub", "--replica", f"http://127.0.0.1:{stub.server_port}"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(router.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        body = json.dumps({"model": "stub", "prompt": "Once upon a time", "max_tokens": 3}).encode()
        answer, deadline = None, time.monotonic() + 60
        while answer is None and time.monotonic() < deadline and router.poll() is None:
            port = next((m.group(1) for line in list(lines) if (m := LISTENING.search(line))), None)
            if port is None:
                time.sleep(0.3)
                continue
            request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                             headers={"content-type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    answer = json.loads(response.read())
            except OSError:  # no healthy replica yet (503)
                time.sleep(0.3)
        assert answer is not None, f"router never answered; exit {router.poll()}; its output: {''.join(lines)}"
        assert answer["choices"][0]["text"] == " from the stub"
        assert StubReplica.seen and StubReplica.seen[-1]["prompt"] == "Once upon a time"
    finally:
        router.terminate()
        try:
            router.wait(timeout=20)
        except subprocess.TimeoutExpired:
            router.kill()
            router.wait()
        reader.join(timeout=10)
        stub.shutdown()
    output = "".join(lines)
    assert "Traceback" not in output, output
