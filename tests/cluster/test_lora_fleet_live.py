"""LoRA adapters through ``kvmesh serve``: one deployment of stories260K on 2 replicas serving PEFT adapters from the
start.

Under concurrent load the follow-ups of an adapter's conversation come back cached (the router keys adapter prompts
as the engine hashes them and sends them where they are cached): none is lost, and the router diverts few enough
from their prefix's replica that the share meets the bench's target; an adapter added at runtime through the router
(``kvmesh lora load``'s call) serves at once, with its own weights. The measured run with 8 adapters is ``kvmesh
bench lora-fleet`` (BENCHMARKS); this is the same driver, smaller.
"""

from __future__ import annotations

import argparse
import asyncio
import json

import httpx
import pytest

from .live_cluster import admin_headers, start_cluster

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(scope="module")
def adapters(stories_path, tmp_path_factory):
    from kvmesh.cluster.measure.benchmarks.support.peft_writer import write_lora_adapter

    root = tmp_path_factory.mktemp("adapters")
    return {name: str(write_lora_adapter(stories_path, root / name, seed=i))
            for i, name in enumerate(["lora-0", "lora-1", "lora-2", "late-0"])}


@pytest.fixture(scope="module")
def fleet(ray_session, stories_path, tmp_path_factory, adapters):
    served = {k: v for k, v in adapters.items() if k.startswith("lora-")}
    deployment = {"model": str(stories_path), "served_model_name": "stories", "num_replicas": 2,
                  "adapters": served, "engine": {"max_loras": 2}}
    serve = start_cluster(stories_path, tmp_path_factory, "lora", engine={
        "model": str(stories_path), "kv_cache_memory": "16MiB", "max_num_batched_tokens": 512, "max_lora_rank": 8},
        deployments={"models": [deployment]})
    yield serve
    serve.stop()


def test_the_router_lists_the_deployment_and_its_adapters(fleet):
    cards = httpx.get(fleet.url + "/v1/models", timeout=10).json()["data"]
    assert {c["id"]: c.get("parent") for c in cards} == {"stories": None, "lora-0": "stories", "lora-1": "stories",
                                                         "lora-2": "stories"}


def test_follow_ups_come_back_cached_and_a_runtime_adapter_serves_at_once(fleet, adapters):
    from kvmesh.cluster.measure.benchmarks.lora_fleet import (
        BLOCK_SIZE,
        CACHED_SHARE_TARGET,
        conversations,
        runtime_loads,
        summarize,
    )

    # A follow-up not cached is either lost (a fault: none may be) or diverted: the cost in seconds sent it away
    # from the replica holding its prefix. At the fleet's start on a busy machine a replica's prefill rate rests on
    # its first step or two, and one slow step can price it several times slower than the other for a while: a
    # diversion or two happens there (reproduced: 0 to 2 in runs of 40 beside two busy loops; BENCHMARKS' run had 2
    # in 320). 60 conversations make the 95% target a share (3 may be diverted), not "every one of 18".
    args = argparse.Namespace(conversations=60, clients=4, zipf=1.1, prompt_tokens=96, question_tokens=8,
                              max_tokens=8, seed=1, timeout_s=120.0)
    fleet.admin_key = json.loads(fleet.admin_key_file.read_text())["admin_key"]
    assert admin_headers(fleet)["Authorization"] == f"Bearer {fleet.admin_key}"

    async def run():
        loads = asyncio.create_task(runtime_loads(args, fleet, {"late-0": adapters["late-0"]}, start_after_s=1.0))
        convs = await conversations(args, fleet.url, ["lora-0", "lora-1", "lora-2"], BLOCK_SIZE)
        return convs, await loads

    convs, loads = asyncio.run(run())
    s = summarize(convs, loads, 1.0, 0.0)
    assert s["answered"] == 60, [c for c in convs if c["follow_up"]["status"] != 200][:2]
    missed = [(c["adapter"], c["follow_up"]["cached_tokens"], c["first"]["route"], c["follow_up"]["route"])
              for c in convs if not c["cached"]]
    assert s["follow_ups_lost"] == 0, missed
    assert s["cached_share"] >= CACHED_SHARE_TARGET, missed
    (late,) = loads
    assert late["load_status"] == 200, late["load_answer"]
    assert late["request"]["status"] == 200 and late["differs_from_base"], late
    assert late["first_token_after_call_s"] < 5.0, late  # the bench measures the 1 s target on a quiet machine
    cards = httpx.get(fleet.url + "/v1/models", timeout=10).json()["data"]
    assert {"id": "late-0", "parent": "stories"}.items() <= next(c for c in cards if c["id"] == "late-0").items()
