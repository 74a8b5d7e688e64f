"""A pull's read overlaps the engine's steps: a running request keeps producing tokens while the read is in
flight (held there by a test double of the transfer handle), and the pulled blocks are hit once it is done;
a read that never finishes times out with its blocks freed uncached."""

from __future__ import annotations

import asyncio
import random
import threading

import pytest
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.engine.async_llm import AsyncLLM
from kvmesh.replica.kv_transfer.agent import agent_for_runner
from kvmesh.replica.kv_transfer.config import KVTransferConfig
from kvmesh.replica.kv_transfer.errors import KVTransferTimeout
from kvmesh.replica.serving.sampling_params import SamplingParams

SEED = "overlap-test-hash-seed"
PROMPT = [random.Random(7).randrange(3, 500) for _ in range(100)]  # 6 full blocks of 16
STALLED_S = 60.0  # no token for this long: the steps are stalled behind the read (a failure, not a speed check)
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


class HeldTransfer:
    """A read whose bytes already moved but that says PROC until the test lets it finish."""

    def __init__(self, num_blocks: int, finish: threading.Event) -> None:
        self.num_blocks, self.finish = num_blocks, finish

    def state(self) -> str:
        return "DONE" if self.finish.is_set() else "PROC"

    def release(self) -> None:
        pass


class HeldAgent:
    """The local transport's agent, its reads held in flight until ``finish`` is set."""

    def __init__(self, agent) -> None:
        self.agent, self.name, self.layout, self.config = agent, agent.name, agent.layout, agent.config
        self.started, self.finish = threading.Event(), threading.Event()

    def add_peer(self, handshake):
        return self.agent.add_peer(handshake)

    def start_read(self, peer, remote_block_ids, local_block_ids, remote_medium="GPU"):
        self.agent.start_read(peer, remote_block_ids, local_block_ids, remote_medium)
        self.started.set()
        return HeldTransfer(len(local_block_ids), self.finish)

    def close(self):
        self.agent.close()


def _engine(stories_path) -> AsyncLLM:
    return AsyncLLM.from_config(EngineConfig(model=str(stories_path), hash_seed=SEED, kv_cache_memory=4 << 20,
                                             debug_check_integrity=True))  # pulls in flight counted


@pytest.fixture
def engines(stories_path):
    holder, puller = _engine(stories_path), _engine(stories_path)
    yield holder, puller
    puller.shutdown()
    holder.shutdown()


async def _final(llm: AsyncLLM, prompt: list[int], params: SamplingParams = GREEDY):
    return [out async for out in llm.generate(prompt, params)][-1]


def _agents(holder: AsyncLLM, puller: AsyncLLM, timeout_s: float, tag: str):
    config = KVTransferConfig(transport="local", timeout_s=timeout_s)
    holder_agent = agent_for_runner(config, f"holder-{tag}", holder.runner)
    puller_agent = HeldAgent(agent_for_runner(config, f"puller-{tag}", puller.runner))
    return holder_agent, puller_agent, puller_agent.add_peer(holder_agent.handshake())


async def _until(event: threading.Event) -> None:
    for _ in range(5000):
        if event.is_set():
            return
        await asyncio.sleep(0.002)
    raise AssertionError("the read never started")


async def test_a_running_request_keeps_producing_tokens_while_a_pull_is_in_flight(engines):
    holder, puller = engines
    held = await _final(holder, PROMPT)
    holder_agent, agent, peer = _agents(holder, puller, 60.0, "overlap")
    try:
        lease = await holder.lease_blocks(PROMPT, None, 60.0)
        stream = puller.generate([5, 6, 7, 8], SamplingParams(max_tokens=300, temperature=0.0, ignore_eos=True))
        await anext(stream)  # running
        pull = asyncio.ensure_future(puller.pull_prefix(agent, peer, PROMPT, lease.remote_block_ids))
        await _until(agent.started)
        produced = 0
        while produced < 20:  # steps go on while the read is in flight (a blocking read would stall here: bounded)
            produced += len((await asyncio.wait_for(anext(stream), STALLED_S)).new_token_ids)
            assert not pull.done()
        agent.finish.set()
        assert await pull == 96
        await stream.aclose()
        out = await _final(puller, PROMPT)
        assert out.num_cached_tokens == 96 and out.output_token_ids == held.output_token_ids
        assert await holder.release_lease(lease.lease_id) == 6
    finally:
        agent.close()
        holder_agent.close()


async def test_a_read_that_never_finishes_times_out_and_frees_its_blocks(engines):
    holder, puller = engines
    await _final(holder, PROMPT)
    holder_agent, agent, peer = _agents(holder, puller, 0.2, "timeout")
    try:
        lease = await holder.lease_blocks(PROMPT, None, 60.0)
        pool = puller.engine.kv_cache_manager.block_pool
        free_before = pool.get_num_free_blocks()
        with pytest.raises(KVTransferTimeout):
            await puller.pull_prefix(agent, peer, PROMPT, lease.remote_block_ids)
        assert pool.get_num_free_blocks() == free_before
        out = await _final(puller, PROMPT)
        assert out.num_cached_tokens == 0  # nothing was cached from the unfinished read
    finally:
        agent.close()
        holder_agent.close()
