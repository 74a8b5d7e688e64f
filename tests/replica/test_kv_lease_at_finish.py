"""The prefill side's lease is taken on the engine thread as the request finishes, before its blocks could be
evicted: under eviction pressure (a tiny cache, another prompt waiting for room) the handle still names every
full block of the prompt, and a pull from it gives the same greedy text as computing the prompt."""

from __future__ import annotations

import concurrent.futures
import random

import pytest
from kvmesh.replica.engine.engine_request import EngineRequest
from kvmesh.replica.engine.kv_transfers import EngineKVTransfers
from kvmesh.replica.engine.remote_kv import RemoteKV
from kvmesh.replica.kv_transfer.agent import KVTransferConfig, agent_for_runner
from kvmesh.replica.kv_transfer.leases import LeaseCaps
from kvmesh.replica.kv_transfer.prefix_pull import pull_prefix
from kvmesh.replica.llm import LLM
from kvmesh.replica.serving.sampling_params import SamplingParams

SEED = "shared-cluster-seed"
PROMPT = [random.Random(7).randrange(3, 500) for _ in range(428)]  # 26 full blocks of 16 and 12 tokens
FILLER = [random.Random(8).randrange(3, 500) for _ in range(340)]  # 22 blocks: fits only by evicting PROMPT's
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
NUM_KV_BLOCKS = 48  # 47 usable: PROMPT (27) and FILLER (22) do not fit together


def _llm(stories_path, num_kv_blocks: int = NUM_KV_BLOCKS) -> LLM:
    return LLM(str(stories_path), device="cpu", num_kv_blocks=num_kv_blocks, hash_seed=SEED,
               debug_check_integrity=True)  # the pool checked after every step, leases and pulls included


LEASED = RemoteKV(lease_ttl_s=30.0, peer="router", engine_id="holder")
"""A prefill side's request: its prompt's blocks leased as it finishes."""


def _run_until(engine, request_id: str):
    """Step until ``request_id`` finishes; its final output."""
    while not (final := [o for o in engine.step() if o.finished and o.request_id == request_id]):
        pass
    return final[0]


@pytest.fixture
def holder(stories_path):
    llm = _llm(stories_path)
    kv = llm.llm_engine.connector(EngineKVTransfers)  # the engine calls its request_finished (kv_connector.py)
    kv.leases.caps = LeaseCaps(max_blocks_fraction=0.75)  # the 26-block lease is over half of this tiny pool
    agent = agent_for_runner(KVTransferConfig(transport="local"), "holder", llm.llm_engine.model_runner)
    yield llm.llm_engine, kv, agent
    agent.close()


def test_a_request_finishing_under_eviction_pressure_keeps_every_prompt_block_for_its_puller(holder, stories_path):
    engine, kv, holder_agent = holder
    engine.add_request(EngineRequest("prefill", PROMPT, SamplingParams(max_tokens=1, temperature=0.0),
                                     remote_kv=LEASED))
    engine.add_request(EngineRequest("filler", FILLER, SamplingParams(max_tokens=4, temperature=0.0)))  # waits for room
    handle = _run_until(engine, "prefill").kv_lease  # the lease rides out on the final output
    assert len(handle["remote_block_ids"]) == 26 and handle["num_tokens"] == 416 and handle["remote_lease_id"]
    assert handle["remote_engine_id"] == "holder" and handle["do_remote_prefill"]
    for _ in range(5):  # the filler's steps: it cannot take the leased blocks
        engine.step()

    puller = _llm(stories_path, 64)
    agent = agent_for_runner(KVTransferConfig(transport="local"), "puller", puller.llm_engine.model_runner)
    try:
        peer = agent.add_peer(holder_agent.handshake())
        manager = puller.llm_engine.kv_cache_manager
        assert pull_prefix(manager, agent, peer, PROMPT, handle["remote_block_ids"]) == 416
        (pulled,) = puller.generate([PROMPT], GREEDY)
    finally:
        agent.close()
    (computed,) = _llm(stories_path, 64).generate([PROMPT], GREEDY)
    assert pulled.num_cached_tokens == 416
    assert pulled.output_token_ids == computed.output_token_ids

    assert kv.leases.release(engine.kv_cache_manager, handle["remote_lease_id"]) == 26
    _run_until(engine, "filler")  # the lease let go: the filler gets its room
    engine.kv_cache_manager.check_integrity()


def test_an_aborted_request_ends_with_an_empty_handle_and_holds_nothing(holder):
    engine, kv, _ = holder
    engine.add_request(EngineRequest("prefill", PROMPT, SamplingParams(max_tokens=8, temperature=0.0),
                                     remote_kv=LEASED))
    engine.step()
    engine.abort_request("prefill")
    (final,) = [o for o in engine.step() if o.request_id == "prefill"]
    assert final.finish_reason == "abort"
    assert final.kv_lease["remote_lease_id"] == "" and final.kv_lease["remote_block_ids"] == []
    assert kv.leases.active == 0
    engine.kv_cache_manager.check_integrity()


def test_over_http_a_prefill_handle_under_eviction_pressure_is_whole_and_pulls_the_same_text(stories_path):
    from .kv_replicas import client, kv_replica, register

    body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    # the 26-block lease is over half of this tiny pool: the leased-blocks cap raised to let it be taken
    with kv_replica(stories_path, num_kv_blocks=NUM_KV_BLOCKS, kv={"max_leased_blocks_fraction": 0.75}) as a, \
            kv_replica(stories_path) as b, client(a) as ca, client(b) as cb, \
            concurrent.futures.ThreadPoolExecutor(3) as pool:
        register(b, a)
        reference = cb.post("/v1/completions", json={**body, "cache_salt": "reference"}).json()["choices"][0]["text"]
        prefill = pool.submit(ca.post, "/v1/completions",
                              json={**body, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}})
        fillers = [pool.submit(ca.post, "/v1/completions", json={"prompt": FILLER[i:], "max_tokens": 4})
                   for i in range(2)]  # arrive right after: they fit only by evicting the prompt's blocks
        handle = prefill.result().json()["kv_transfer_params"]
        assert len(handle["remote_block_ids"]) == 26 and handle["num_tokens"] == 416
        decode = cb.post("/v1/completions", json={**body, "kv_transfer_params": {**handle, "remote_url": a.http.url}})
        assert decode.headers["x-kvmesh-kv-pull"] == "ok" and int(decode.headers["x-kvmesh-kv-pulled-tokens"]) == 416
        assert decode.json()["choices"][0]["text"] == reference
        assert all(f.result().status_code == 200 for f in fillers)  # the released lease let them run
