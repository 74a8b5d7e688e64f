"""A stories260K replica with a ~50-block device pool and a 64 MiB host tier, over HTTP and ZeroMQ: a
prompt pushed out of the device comes back from host memory with the same text, and the event stream,
``/load`` and ``/metrics`` show both tiers."""

from __future__ import annotations

import random

import httpx
import pytest
from kvmesh.events.schema import BlockRemoved, BlockStored

from .stories_replica import stories_replica
from .test_server_http import replay


@pytest.fixture(scope="module")
def replica(stories_path):
    with stories_replica(stories_path, kv_cache_memory="1MiB", kv_offload_memory="64MiB") as runtime:
        yield runtime


def complete(client: httpx.Client, prompt: list[int]) -> dict:
    r = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 16, "temperature": 0,
                                             "ignore_eos": True})
    assert r.status_code == 200, r.text
    return r.json()


def test_prompt_pushed_out_of_the_device_comes_back_from_host_memory(replica):
    rng = random.Random(0)
    long_prompt = [rng.randrange(3, 500) for _ in range(428)]
    with httpx.Client(base_url=replica.http.url, timeout=120) as client:
        first = complete(client, long_prompt)
        for _ in range(8):
            complete(client, [rng.randrange(3, 500) for _ in range(300)])
        again = complete(client, long_prompt)
        load = client.get("/load").json()
        metrics = client.get("/metrics").text
    details = again["usage"]["prompt_tokens_details"]
    assert details["cached_tokens"] >= 256 and details["host_cached_tokens"] >= 256  # loaded back, not recomputed
    assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0, "host_cached_tokens": 0}
    assert again["choices"][0]["text"] == first["choices"][0]["text"]
    events = [e for _, batch in replay(replica.endpoints()["replay_endpoint"]) for e in batch.events]
    assert {e.medium for e in events if type(e) is BlockStored} == {"GPU", "CPU"}
    assert any(type(e) is BlockRemoved and e.medium == "GPU" for e in events)  # the device pool turned over
    assert 40 <= load["num_kv_blocks"] <= 70 and load["num_host_kv_blocks"] > 1000
    assert load["h2d_bytes_per_s"] > 0 and load["prefill_tokens_per_s"] > 0 and load["kv_block_bytes"] > 0
    hits = [line for line in metrics.splitlines() if line.startswith("kvmesh_host_prefix_cache_hits_total")]
    assert hits and float(hits[0].split()[-1]) >= 256
