"""A prompt's prefix pulled from another replica's cache is hit by the next request (in-process transport)."""

from __future__ import annotations

import pytest
from kvmesh.replica.kv_transfer.agent import KVTransferConfig, agent_for_runner
from kvmesh.replica.kv_transfer.prefix_pull import cached_prefix_block_ids, pull_prefix
from kvmesh.replica.llm import LLM
from kvmesh.replica.serving.sampling_params import SamplingParams

SEED = "shared-cluster-seed"  # replicas of one cluster hash alike
PROMPT = list(range(7, 7 + 75))  # 4 full blocks of 16 and a partial one
GREEDY = SamplingParams(max_tokens=12, temperature=0.0)


def _engine(stories_path, **config) -> LLM:
    return LLM(str(stories_path), device="cpu", num_kv_blocks=32, hash_seed=SEED, **config)


@pytest.fixture
def pair(stories_path):
    """(holder LLM after generating for PROMPT, its greedy output, a fresh puller LLM, the puller's agent,
    the holder's agent name)."""
    holder, puller = _engine(stories_path), _engine(stories_path)
    (out,) = holder.generate([PROMPT], GREEDY)
    config = KVTransferConfig(transport="local")
    holder_agent = agent_for_runner(config, "holder", holder.llm_engine.model_runner)
    puller_agent = agent_for_runner(config, "puller", puller.llm_engine.model_runner)
    peer = puller_agent.add_peer(holder_agent.handshake())
    yield holder, out, puller, puller_agent, peer, holder_agent
    puller_agent.close()
    holder_agent.close()


def test_pulled_prefix_is_a_cache_hit_with_the_same_greedy_text(pair):
    holder, held_out, puller, agent, peer, _ = pair
    remote = cached_prefix_block_ids(holder.llm_engine.kv_cache_manager, PROMPT)
    assert len(remote) == 4
    assert pull_prefix(puller.llm_engine.kv_cache_manager, agent, peer, PROMPT, remote) == 64
    (out,) = puller.generate([PROMPT], GREEDY)
    assert out.num_cached_tokens == 64
    assert out.output_token_ids == held_out.output_token_ids and out.text == held_out.text
    puller.llm_engine.kv_cache_manager.check_integrity()


def test_only_the_blocks_the_puller_lacks_are_pulled(pair):
    holder, _, puller, agent, peer, _ = pair
    puller.generate([PROMPT[:40]], SamplingParams(max_tokens=1))  # the puller computes 2 blocks itself
    remote = cached_prefix_block_ids(holder.llm_engine.kv_cache_manager, PROMPT)
    manager = puller.llm_engine.kv_cache_manager
    assert pull_prefix(manager, agent, peer, PROMPT, remote) == 32
    assert pull_prefix(manager, agent, peer, PROMPT, remote) == 0  # now held: nothing to pull
    assert puller.generate([PROMPT], GREEDY)[0].num_cached_tokens == 64


def test_pulled_blocks_are_copied_down_to_the_host_tier_like_computed_ones(pair, stories_path):
    holder, held_out, _, _, _, holder_agent = pair
    puller = _engine(stories_path, kv_offload_memory=1 << 20)
    agent = agent_for_runner(KVTransferConfig(transport="local"), "tiered", puller.llm_engine.model_runner)
    try:
        peer = agent.add_peer(holder_agent.handshake())
        remote = cached_prefix_block_ids(holder.llm_engine.kv_cache_manager, PROMPT)
        manager = puller.llm_engine.kv_cache_manager
        assert pull_prefix(manager, agent, peer, PROMPT, remote) == 64
        (out,) = puller.generate([PROMPT], GREEDY)  # its step carries the pulled blocks' copies down
        assert out.num_cached_tokens == 64 and out.output_token_ids == held_out.output_token_ids
        assert manager.offload.stats.stored_blocks >= 4
        manager.check_integrity()
    finally:
        agent.close()


def test_a_failed_pull_leaves_nothing_cached_and_the_prompt_is_computed(pair):
    holder, held_out, puller, agent, peer, holder_agent = pair
    remote = cached_prefix_block_ids(holder.llm_engine.kv_cache_manager, PROMPT)
    holder_agent.close()  # the holder is gone
    manager = puller.llm_engine.kv_cache_manager
    free_before = manager.block_pool.get_num_free_blocks()
    assert pull_prefix(manager, agent, peer, PROMPT, remote) == 0
    assert manager.block_pool.get_num_free_blocks() == free_before
    (out,) = puller.generate([PROMPT], GREEDY)
    assert out.num_cached_tokens == 0 and out.output_token_ids == held_out.output_token_ids
    manager.check_integrity()


async def test_a_serving_engine_pulls_between_steps_and_its_next_request_hits(pair, stories_path):
    from kvmesh.replica.config import EngineConfig
    from kvmesh.replica.engine.async_llm import AsyncLLM
    from kvmesh.replica.engine.llm_engine import LLMEngine

    holder, held_out, _, _, _, holder_agent = pair
    serving = AsyncLLM(LLMEngine(EngineConfig(model=str(stories_path), device="cpu", num_kv_blocks=32,
                                              hash_seed=SEED)))
    agent = agent_for_runner(KVTransferConfig(transport="local"), "serving", serving.runner)
    try:
        peer = agent.add_peer(holder_agent.handshake())
        remote = cached_prefix_block_ids(holder.llm_engine.kv_cache_manager, PROMPT)
        assert await serving.pull_prefix(agent, peer, PROMPT, remote) == 64
        outs = [o async for o in serving.generate(PROMPT, GREEDY)]
        assert outs[-1].num_cached_tokens == 64 and outs[-1].output_token_ids == held_out.output_token_ids
        free = serving.engine.kv_cache_manager.block_pool.get_num_free_blocks()
        with pytest.raises(ValueError, match=r"remote block ids \[99, 98\] are outside"):
            await serving.pull_prefix(agent, peer, list(range(500, 540)), [99, 98])
        assert serving.engine.kv_cache_manager.block_pool.get_num_free_blocks() == free  # nothing kept
    finally:
        agent.close()
        serving.shutdown()
