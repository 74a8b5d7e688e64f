"""Interop with code no one here wrote: vllm-router's ``kv_aware`` policy subscribes to a kvmesh replica's
KV events (vLLM's wire format, vLLM's default topic "") and credits the cached prefix of a repeated prompt.

vllm-router is not a kvmesh dependency; install it into a venv outside the repository and point
``KVMESH_VLLM_ROUTER`` at its ``vllm-router`` executable (or that venv), e.g.
``python -m venv /work/peers/vllm-router && /work/peers/vllm-router/bin/pip install vllm-router``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from kvmesh.events.subscribe.subscriber import wait_until
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.runtime import ReplicaRuntime
from kvmesh.replica.server.config import ReplicaServerConfig

STORY = ("Once upon a time, there was a little girl named Lily. She loved to play in the park with her big red "
         "ball. One day, she saw a dog in the park.")  # 48 tokens: 3 full blocks of 16
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_DECISION = re.compile(r"KV prefix decision .*?input_tokens=(\d+) .*?credited_prefix_tokens=(\d+)")


@pytest.fixture
def vllm_router_exe() -> str:
    """The vllm-router executable (skips when there is none), checked before any server starts."""
    configured = os.environ.get("KVMESH_VLLM_ROUTER")
    if configured:
        path = Path(configured)
        exe = path / "bin" / "vllm-router" if path.is_dir() else path
        if not exe.is_file():
            pytest.fail(f"KVMESH_VLLM_ROUTER={configured} is neither vllm-router nor a venv that has it")
        return str(exe)
    found = shutil.which("vllm-router")
    if found is None:
        pytest.skip("vllm-router not installed (pip install vllm-router into a venv; set KVMESH_VLLM_ROUTER)")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def decisions(log: Path) -> list[tuple[int, int]]:
    """(input_tokens, credited_prefix_tokens) of every kv_aware decision vllm-router logged so far."""
    return [(int(a), int(b)) for a, b in _DECISION.findall(_ANSI.sub("", log.read_text(errors="replace")))]


@pytest.fixture
def replica(stories_path):
    runtime = ReplicaRuntime.start(EngineConfig(model=str(stories_path), kv_cache_memory=4 << 20),
                                   ReplicaServerConfig(port=0, event_port=0, replay_port=0,
                                                       served_model_name="stories"))
    yield runtime
    runtime.shutdown(graceful_s=1)


@contextlib.contextmanager
def running_vllm_router(exe: str, replica: ReplicaRuntime, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """vllm-router (kv_aware) in front of ``replica``, fed by its event and replay sockets: (its URL, its log)."""
    ends, url, port = replica.endpoints(), replica.http.url, free_port()
    log = tmp_path / "vllm-router.log"
    cmd = [exe, "--host", "127.0.0.1", "--port", str(port), "--worker-urls", url, "--policy", "kv_aware",
           "--kv-event-source", f"{url}={ends['events_endpoint']}",
           "--kv-event-replay-source", f"{url}={ends['replay_endpoint']}",
           "--kv-event-block-size", str(ends["block_size"]), "--kv-event-model", "stories", "--log-level", "debug"]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "NO_COLOR": "1"})
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"vllm-router exited: {log.read_text()[-2000:]}"
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"vllm-router not healthy in 60 s: {log.read_text()[-2000:]}"
            time.sleep(0.3)
        yield base, log
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.fixture
def vllm_router(vllm_router_exe, replica, tmp_path):
    with running_vllm_router(vllm_router_exe, replica, tmp_path) as router:
        yield router


def complete(base: str) -> dict:
    r = httpx.post(base + "/v1/completions", json={"model": "stories", "prompt": STORY, "max_tokens": 4}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_kv_aware_credits_the_prefix_a_kvmesh_replica_announced(vllm_router):
    base, log = vllm_router
    first = complete(base)
    assert decisions(log)[0] == (48, 0)  # nothing cached yet: nothing credited
    assert first["usage"]["prompt_tokens"] == 48
    credited = 0
    for _ in range(20):  # the BlockStored batch reaches vllm-router's subscriber asynchronously
        time.sleep(0.25)
        again = complete(base)
        credited = decisions(log)[-1][1]
        if credited:
            break
    assert 32 <= credited <= 48, decisions(log)  # at least the two blocks a repeat can reuse
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # and the replica did reuse them



@pytest.fixture(params=["64MiB", None], ids=["host-tier", "no-tier"])
def small_replica(stories_path, request):
    """A replica with a ~50-block device pool, with or without a 64 MiB host tier."""
    runtime = ReplicaRuntime.start(EngineConfig(model=str(stories_path), kv_cache_memory="1MiB",
                                                kv_offload_memory=request.param),
                                   ReplicaServerConfig(port=0, event_port=0, replay_port=0,
                                                       served_model_name="stories"))
    yield runtime
    runtime.shutdown(graceful_s=1)


def test_kv_aware_credits_host_tier_blocks_at_its_host_penalty(vllm_router_exe, small_replica, tmp_path):
    """vllm-router's kv_aware reads ``medium``: a prefix that left the device for the host tier ("CPU" blocks)
    is still credited, discounted by its hand-set ``kv_penalty_host`` (0.8); without a tier it is gone."""
    with running_vllm_router(vllm_router_exe, small_replica, tmp_path) as (base, log):
        body = {"model": "stories", "prompt": " ".join(f"{STORY} Chapter {i}." for i in range(5)), "max_tokens": 4}
        for prompt in [body["prompt"]] + [" ".join(f"Tom and Sue saw dog {i} {j} in the park." for j in range(12))
                                          for i in range(8)]:  # the first prompt, then 8 that push it out
            r = httpx.post(base + "/v1/completions", json={**body, "prompt": prompt}, timeout=60)
            assert r.status_code == 200, r.text
        load = small_replica.http.url + "/load"
        assert wait_until(lambda: httpx.get(load).json()["kv_events_unsent_s"] == 0.0, 10.0), "events not sent"
        again = httpx.post(base + "/v1/completions", json=body, timeout=60).json()["usage"]
        credited = decisions(log)[-1][1]
        host = again["prompt_tokens_details"].get("host_cached_tokens")
        if small_replica.llm.engine.config.kv_offload_memory:
            assert host >= 256 and again["prompt_tokens_details"]["cached_tokens"] == host  # loaded back
            assert int(0.7 * host) <= credited < host  # credited, at kv_penalty_host
        else:
            assert host is None and again["prompt_tokens_details"]["cached_tokens"] == 0 and credited == 0
