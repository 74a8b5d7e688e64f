"""The HTTP pull end to end across two processes on real nixl (UCX): a ``kvmesh replica --kv-transfer``
subprocess holds the prompt, an in-process replica pulls it with ``do_remote_prefill`` and answers the same
greedy text with the pulled tokens cached."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from kvmesh.replica.kv_transfer.nixl_agent import nixl_missing

from .kv_replicas import KEY, SEED, client, kv_replica

pytestmark = pytest.mark.skipif(nixl_missing() is not None, reason=str(nixl_missing()))

PROMPT = [random.Random(33).randrange(3, 500) for _ in range(428)]  # 26 full blocks of 16


@pytest.fixture
def holder_url(stories_path):
    """A ``kvmesh replica`` process with KV transfer on (nixl), its HTTP URL."""
    env = {**os.environ, "KVMESH_HASH_SEED": SEED, "KVMESH_API_KEY": KEY}
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "kvmesh"), "replica", "--model", str(stories_path), "--port", "0",
         "--event-port", "none", "--kv-cache-memory", "4MiB", "--kv-transfer", "--kv-transfer-transport", "nixl"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
    try:
        # the endpoints' JSON line once it serves (nixl logs to stdout too); the lines end if it dies
        line = next((line for line in process.stdout if line.startswith("{")), None)
        assert line, f"kvmesh replica exited with {process.wait()}"
        endpoints = json.loads(line)
        assert endpoints["kv_transfer"] is True
        yield endpoints["http_url"]
    finally:
        process.terminate()
        process.wait(timeout=60)


def test_a_prompt_computed_in_another_process_is_pulled_over_http_and_nixl(stories_path, holder_url):
    import httpx

    headers = {"Authorization": f"Bearer {KEY}"}
    body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    with httpx.Client(base_url=holder_url, headers=headers, timeout=120) as holder:
        held = holder.post("/v1/completions", json=body)
        assert held.status_code == 200, held.text
    # the holder is a --kv-peer of the puller (no router registers it)
    with kv_replica(stories_path, transport="nixl", kv={"peers": (holder_url,)}) as runtime, \
            client(runtime) as puller:
        r = puller.post("/v1/completions", json={**body, "kv_transfer_params": {
            "do_remote_prefill": True, "remote_url": holder_url}})
        assert r.status_code == 200, r.text
        assert r.headers["x-kvmesh-kv-pull"] == "ok" and r.headers["x-kvmesh-kv-pulled-tokens"] == "416"
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 416
        assert r.json()["choices"][0]["text"] == held.json()["choices"][0]["text"]
        assert puller.get("/load").json()["kv_transfer"]["pull_bytes_per_s"] > 0
