"""KV blocks of a real engine (stories260K) read by block id over NIXL (UCX) from another process."""

from __future__ import annotations

import contextlib

import pytest
import torch
from kvmesh.cluster.measure.benchmarks.support.kv_peer import HolderSpec, receive_holder, start_holder
from kvmesh.replica.kv_layout import block_layout
from kvmesh.replica.kv_transfer.agent import (
    KVTransferConfig,
    agent_for_runner,
    decode_handshake,
    make_kv_transfer_agent,
    read_blocks,
)
from kvmesh.replica.kv_transfer.errors import KVLayoutMismatch, KVTransferError
from kvmesh.replica.kv_transfer.nixl_agent import nixl_missing
from kvmesh.replica.kv_transfer.prefix_pull import pull_prefix
from kvmesh.replica.llm import LLM
from kvmesh.replica.serving.sampling_params import SamplingParams

pytestmark = pytest.mark.skipif(nixl_missing() is not None, reason=str(nixl_missing()))

PROMPT = tuple(range(5, 5 + 70))  # 4 full blocks of 16 and a partial one
NUM_KV_BLOCKS = 32
SEED = "shared-cluster-seed"  # replicas of one cluster hash alike
MAX_TOKENS = 12


@contextlib.contextmanager
def _holder(stories_path):
    """(pipe, process, its handshake, a copy of its cache, the ids of its blocks holding data)."""
    conn, process = start_holder(HolderSpec("holder", model=str(stories_path), prompt=PROMPT, max_tokens=MAX_TOKENS,
                                            hash_seed=SEED, num_kv_blocks=NUM_KV_BLOCKS))
    try:
        ready = receive_holder(conn)
        yield conn, process, decode_handshake(ready.handshake), ready.cache, ready.written, ready
    finally:
        if process.is_alive():
            conn.send("exit")
        process.join(timeout=30)


@pytest.fixture(scope="module")
def holder(stories_path):
    """A holder process the reading tests share (a process loading the engine: seconds); they only read it."""
    with _holder(stories_path) as h:
        yield h


@pytest.fixture
def doomed_holder(stories_path):
    """A holder of the test's own, for a test that kills it."""
    with _holder(stories_path) as h:
        yield h


@pytest.fixture(scope="module")
def reader_llm(stories_path):
    """A second engine of the same model: its cache is where pulled blocks land."""
    return LLM(str(stories_path), device="cpu", num_kv_blocks=NUM_KV_BLOCKS, hash_seed=SEED)


@pytest.fixture
def reader_runner(reader_llm):
    return reader_llm.llm_engine.model_runner


@pytest.fixture
def reader(reader_llm, reader_runner):
    assert reader_llm.llm_engine.reset_prefix_cache()
    reader_runner.kv_cache.zero_()
    agent = agent_for_runner(KVTransferConfig(timeout_s=5.0), "reader", reader_runner)
    yield agent
    agent.close()


def _blocks(cache: torch.Tensor, layout, block_ids: list[int]) -> torch.Tensor:
    """The bytes of ``block_ids``: [num_regions, len(block_ids), bytes per region]."""
    return cache.view(torch.uint8).view(layout.num_regions, layout.num_blocks, -1)[:, block_ids]


def test_the_nixl_transport_implements_the_agent_interface(reader):
    from kvmesh.replica.kv_transfer.agent import KVTransferAgent

    assert isinstance(reader, KVTransferAgent)


def test_blocks_read_by_id_from_another_process_are_byte_identical(holder, reader, reader_runner):
    _, _, handshake, holder_cache, written, _ = holder
    assert len(written) >= 4, f"the holder's engine wrote {written}"
    local = [NUM_KV_BLOCKS - 1 - i for i in range(len(written))]  # other ids than the holder's
    peer = reader.add_peer(handshake)
    read_blocks(reader, peer, written, local)
    assert torch.equal(_blocks(reader_runner.kv_cache, reader.layout, local),
                       _blocks(holder_cache, handshake.layout, written))
    untouched = sorted(set(range(NUM_KV_BLOCKS)) - set(local))
    assert not _blocks(reader_runner.kv_cache, reader.layout, untouched).any()


def test_a_peer_with_another_layout_is_refused_naming_the_fields(holder):
    _, _, handshake, _, _, _ = holder
    layout = handshake.layout
    half = torch.zeros(layout.num_layers, 2, layout.num_kv_heads, 8, layout.block_size, layout.head_dim,
                       dtype=torch.float16)
    agent = make_kv_transfer_agent(KVTransferConfig(), "half-reader",
                                   half, block_layout(half, layout.kv_layout, layout.block_size,
                                                      layout.num_kv_heads, layout.head_dim))
    try:
        with pytest.raises(KVLayoutMismatch, match=r"dtype: float16 vs float32.*bytes_per_block"):
            agent.add_peer(handshake)
    finally:
        agent.close()


def test_a_block_id_outside_the_peer_cache_is_a_clear_error(holder, reader):
    _, _, handshake, _, _, _ = holder
    peer = reader.add_peer(handshake)
    with pytest.raises(ValueError, match=rf"remote block ids \[{NUM_KV_BLOCKS}\] are outside 1..{NUM_KV_BLOCKS - 1}"):
        read_blocks(reader, peer, [NUM_KV_BLOCKS], [1])
    with pytest.raises(ValueError, match="2 remote block ids but 1 local"):
        read_blocks(reader, peer, [1, 2], [1])


def test_reading_from_a_dead_peer_fails_cleanly_within_the_timeout(doomed_holder, reader):
    conn, process, handshake, _, written, _ = doomed_holder
    peer = reader.add_peer(handshake)
    conn.send("die")
    process.join(timeout=30)
    assert not process.is_alive()
    with pytest.raises(KVTransferError, match="recompute|failed"):
        read_blocks(reader, peer, written, [1 + i for i in range(len(written))], timeout_s=5.0)


def test_a_prefix_pulled_from_another_process_is_hit_with_the_same_greedy_text(holder, reader, reader_llm):
    _, _, handshake, _, _, ready = holder
    assert len(ready.prefix_block_ids) == 4
    peer = reader.add_peer(handshake)
    manager = reader_llm.llm_engine.kv_cache_manager
    assert pull_prefix(manager, reader, peer, list(PROMPT), ready.prefix_block_ids) == 64
    (out,) = reader_llm.generate([list(PROMPT)], SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0))
    assert out.num_cached_tokens == 64
    assert out.output_token_ids == ready.output_token_ids


def test_an_idle_agent_leaves_the_cpu_alone(reader):
    """UCX's progress thread sleeps in poll() between events: an idle agent (one per replica and TP rank)
    must not busy-poll a core. With nixl's own fixed delay of 0 this process burned ~1 CPU-second per second."""
    import time

    cpu0, wall0 = time.process_time(), time.perf_counter()
    time.sleep(1.0)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    assert cpu < 0.25 * wall, f"{cpu:.2f} CPU-s in {wall:.2f} s with an idle agent"


def test_fp8_blocks_read_from_another_process_are_byte_identical_and_a_bf16_peer_is_refused():
    """An FP8 cache moves as its bytes (half a bf16 block's); a reader of another KV dtype is refused naming both."""
    spec = HolderSpec("fp8-holder", num_kv_blocks=8, num_layers=2, num_kv_heads=2, head_dim=16, dtype="float8_e4m3fn")
    conn, process = start_holder(spec)
    try:
        ready = receive_holder(conn)
        handshake = decode_handshake(ready.handshake)
        agents, caches = [], []
        for name, dtype in (("fp8-reader", torch.float8_e4m3fn), ("bf16-reader", torch.bfloat16)):
            cache = torch.zeros(spec.synthetic_shape(), dtype=dtype)
            caches.append(cache)
            agents.append(make_kv_transfer_agent(KVTransferConfig(timeout_s=5.0), name, cache, block_layout(
                cache, spec.kv_layout, spec.block_size, spec.num_kv_heads, spec.head_dim)))
        fp8, bf16 = agents
        try:
            assert handshake.layout.dtype == "float8_e4m3fn" and fp8.layout.bytes_per_block * 2 == \
                bf16.layout.bytes_per_block
            read_blocks(fp8, fp8.add_peer(handshake), [1, 5, 6], [2, 3, 7])
            assert torch.equal(_blocks(caches[0], fp8.layout, [2, 3, 7]),
                               _blocks(ready.cache, handshake.layout, [1, 5, 6]))
            with pytest.raises(KVLayoutMismatch, match="KV cache dtype bfloat16 on 'bf16-reader' vs float8_e4m3fn"):
                bf16.add_peer(handshake)
        finally:
            for agent in agents:
                agent.close()
    finally:
        if process.is_alive():
            conn.send("exit")
        process.join(timeout=30)
