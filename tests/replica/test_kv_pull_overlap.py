"""A pull's read never blocks a step and a failed read never lands late in reused blocks.

Overlap: the read is started off the engine thread (a double whose ``start_read`` copies synchronously, as
nixl does on host memory, and blocks until the test lets it finish): a running request keeps producing tokens
meanwhile, and the pulled blocks are hit once it is done.

Late reads: a double whose transfer really writes the holder's bytes into the puller's blocks when the test
lets it "land", after the pull has failed (timed out; reported ERR with the write still pending; one tier's read
erred beside a device read still in flight). Until it lands its blocks are quarantined: other requests that
allocate every free block after the failure never get them, so the late write changes no block a live request
or the prefix cache holds; once the transport lets the read go, the blocks are freed.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time

import pytest
import torch
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.engine.async_llm import AsyncLLM
from kvmesh.replica.kv_transfer.agent import agent_for_runner
from kvmesh.replica.kv_transfer.config import KVTransferConfig
from kvmesh.replica.kv_transfer.errors import KVTransferError, KVTransferTimeout
from kvmesh.replica.kv_transfer.prefix_pull import cached_prefix_block_ids
from kvmesh.replica.server.kv_metrics import KVTransferMetrics
from kvmesh.replica.server.state import _quarantined_blocks
from kvmesh.replica.serving.sampling_params import SamplingParams
from prometheus_client import CollectorRegistry

SEED = "overlap-test-hash-seed"
PROMPT = [random.Random(7).randrange(3, 500) for _ in range(100)]  # 6 full blocks of 16
FILLERS = [[random.Random(8 + i).randrange(3, 500) for _ in range(192)] for i in range(2)]  # 13 blocks each
PULLER_BLOCKS = 20  # 19 usable: 6 for the pull, 13 for a filler; a filler after the failure takes every free one
STALLED_S = 60.0  # no token for this long: the steps are stalled behind the read (a failure, not a speed check)
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


class LateTransfer:
    """A read that writes its bytes when ``land`` is set (on its own thread, like a NIC or a copy engine). It says
    ``reports`` (PROC, or ERR for a transport that already knows the read failed) until then, then DONE; abort
    cannot stop it, and its handle cannot be released before it landed (as nixl refuses)."""

    def __init__(self, write, num_blocks: int, land: threading.Event, reports: str) -> None:
        self.num_blocks, self.reports, self.landed, self.aborted = num_blocks, reports, threading.Event(), False
        threading.Thread(target=self._land, args=(write, land), daemon=True).start()

    def _land(self, write, land: threading.Event) -> None:
        land.wait()
        write()
        self.landed.set()

    def state(self) -> str:
        return "DONE" if self.landed.is_set() else self.reports

    def abort(self) -> None:
        self.aborted = True

    def release(self) -> bool:
        return self.landed.is_set()


class FailedTransfer:
    """A read the transport failed at once, having written nothing."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks

    def state(self) -> str:
        return "ERR"

    def abort(self) -> None:
        pass

    def release(self) -> bool:
        return True


class LateAgent:
    """The local transport's agent with its reads' timing in the test's hands.

    ``mode``: ``"blocking"`` copies inside ``start_read`` once ``land`` is set (nixl's synchronous copy on host
    memory); ``"late"`` and ``"err"`` return a LateTransfer reporting PROC / ERR; host-tier (``"CPU"``) reads fail
    at once when ``cpu_fails``."""

    def __init__(self, agent, mode: str, cpu_fails: bool = False) -> None:
        self.agent, self.name, self.layout, self.config = agent, agent.name, agent.layout, agent.config
        self.tp_size = agent.tp_size
        self.mode, self.cpu_fails = mode, cpu_fails
        self.started, self.land = threading.Event(), threading.Event()
        self.transfers: list[LateTransfer] = []
        self.landed_ids: list[int] = []

    def add_peer(self, handshake):
        return self.agent.add_peer(handshake)

    def start_read(self, peer, remote_block_ids, local_block_ids, remote_medium="GPU"):
        self.started.set()
        if remote_medium == "CPU" and self.cpu_fails:
            return FailedTransfer(len(local_block_ids))

        def write():
            self.agent.start_read(peer, remote_block_ids, local_block_ids, "GPU")
            self.landed_ids += local_block_ids

        if self.mode == "blocking":
            self.land.wait()
            write()
            return _Done(len(local_block_ids))
        transfer = LateTransfer(write, len(local_block_ids), self.land, "ERR" if self.mode == "err" else "PROC")
        self.transfers.append(transfer)
        return transfer

    def close(self):
        self.agent.close()


class _Done(FailedTransfer):
    """A read that completed inside ``start_read``."""

    def state(self) -> str:
        return "DONE"


def _engine(stories_path, **config) -> AsyncLLM:
    return AsyncLLM.from_config(EngineConfig(model=str(stories_path), hash_seed=SEED, kv_cache_memory=4 << 20,
                                             debug_check_integrity=True, **config))  # held blocks counted


@pytest.fixture
def engines(stories_path):
    holder, puller = _engine(stories_path), _engine(stories_path, num_kv_blocks=PULLER_BLOCKS)
    yield holder, puller
    puller.shutdown()
    holder.shutdown()


def _gauge(llm: AsyncLLM) -> float:
    """The replica's ``kvmesh_kv_transfer_quarantined_blocks`` as its /metrics would export it."""
    registry = CollectorRegistry()
    KVTransferMetrics(registry, lambda: (0, 0, 0), lambda: _quarantined_blocks(llm))
    return registry.get_sample_value("kvmesh_kv_transfer_quarantined_blocks")


async def _final(llm: AsyncLLM, prompt: list[int], params: SamplingParams = GREEDY):
    return [out async for out in llm.generate(prompt, params)][-1]


def _agents(holder: AsyncLLM, puller: AsyncLLM, timeout_s: float, tag: str, mode: str, cpu_fails: bool = False):
    config = KVTransferConfig(transport="local", timeout_s=timeout_s)
    holder_agent = agent_for_runner(config, f"holder-{tag}", holder.runner)
    puller_agent = LateAgent(agent_for_runner(config, f"puller-{tag}", puller.runner), mode, cpu_fails)
    return holder_agent, puller_agent, puller_agent.add_peer(holder_agent.handshake())


async def _until(check, what: str, bound_s: float = 10.0) -> None:
    deadline = time.monotonic() + bound_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {bound_s} s")
        await asyncio.sleep(0.002)


async def test_a_running_request_keeps_producing_tokens_while_a_read_copies(engines):
    holder, puller = engines
    held = await _final(holder, PROMPT)
    holder_agent, agent, peer = _agents(holder, puller, 60.0, "overlap", "blocking")
    try:
        lease = await holder.lease_blocks(PROMPT, None, 60.0)
        stream = puller.generate([5, 6, 7, 8], SamplingParams(max_tokens=300, temperature=0.0, ignore_eos=True))
        await anext(stream)  # running
        pull = asyncio.ensure_future(puller.pull_prefix(agent, peer, PROMPT, lease.remote_block_ids))
        await _until(agent.started.is_set, "the read's start")
        produced = 0
        while produced < 20:  # steps go on while start_read copies (on the engine thread they would stall: bounded)
            produced += len((await asyncio.wait_for(anext(stream), STALLED_S)).new_token_ids)
            assert not pull.done()
        agent.land.set()
        assert await pull == 96
        await stream.aclose()
        out = await _final(puller, PROMPT)
        assert out.num_cached_tokens == 96 and out.output_token_ids == held.output_token_ids
        assert await holder.release_lease(lease.lease_id) == 6
    finally:
        agent.close()
        holder_agent.close()


@pytest.mark.parametrize(("mode", "timeout_s", "media", "error"), [
    ("late", 0.3, None, KVTransferTimeout),           # times out while the read is in flight
    ("err", 60.0, None, KVTransferError),             # the transport says ERR with its write still pending
    ("late", 60.0, ["GPU"] * 3 + ["CPU"] * 3, KVTransferError),  # the host tier's read fails, the device's runs on
], ids=["timeout", "error", "failed-tier-beside-a-live-one"])
async def test_a_failed_read_that_lands_late_writes_only_quarantined_blocks(engines, mode, timeout_s, media, error):
    holder, puller = engines
    await _final(holder, PROMPT)
    holder_agent, agent, peer = _agents(holder, puller, timeout_s, f"late-{mode}-{media is not None}", mode,
                                        cpu_fails=media is not None)
    try:
        lease = await holder.lease_blocks(PROMPT, None, 60.0)
        transfers, pool = puller.kv_transfers, puller.engine.kv_cache_manager.block_pool
        free_before = pool.get_num_free_blocks()
        with pytest.raises(error):
            await puller.pull_prefix(agent, peer, PROMPT, lease.remote_block_ids, remote_block_media=media)
        assert pool.get_num_free_blocks() == free_before - 6  # failed, yet every block of the pull still held
        assert transfers.quarantined_blocks == 6 and _gauge(puller) == 6  # and counted, on /metrics too
        outs = [await _final(puller, filler) for filler in FILLERS]  # together they take every free block
        manager = puller.engine.kv_cache_manager
        in_use = set(cached_prefix_block_ids(manager, FILLERS[1]))
        assert len(in_use) == 12
        layout = agent.layout
        before = puller.runner.kv_cache.clone().view(layout.num_regions, layout.num_blocks, -1)
        agent.land.set()  # the late write lands now
        await _until(lambda: agent.transfers and all(t.landed.is_set() for t in agent.transfers), "the late write")
        await _until(lambda: transfers.quarantined_blocks == 0, "the quarantined blocks' release")
        assert _gauge(puller) == 0
        after = puller.runner.kv_cache.view(layout.num_regions, layout.num_blocks, -1)
        changed = {b for b in range(layout.num_blocks) if not torch.equal(before[:, b], after[:, b])}
        assert changed and changed <= set(agent.landed_ids)  # the write happened, only where it was aimed
        assert not changed & in_use, "the late read overwrote blocks another request's cached prefix holds"
        again = await _final(puller, FILLERS[1])  # its prefix hit (all but the last block: it recomputes one)
        assert again.num_cached_tokens == 176 and again.output_token_ids == outs[1].output_token_ids
        out = await _final(puller, PROMPT)
        assert out.num_cached_tokens == 0  # nothing of the failed pull was cached
        assert await holder.release_lease(lease.lease_id) == 6
    finally:
        agent.close()
        holder_agent.close()


async def test_an_engine_stopped_with_a_read_in_flight_keeps_its_blocks_held(stories_path):
    holder, puller = _engine(stories_path), _engine(stories_path, num_kv_blocks=PULLER_BLOCKS)
    holder_agent, agent, peer = _agents(holder, puller, 60.0, "stopped", "late")
    try:
        await _final(holder, PROMPT)
        lease = await holder.lease_blocks(PROMPT, None, 60.0)
        pool = puller.engine.kv_cache_manager.block_pool
        free_before = pool.get_num_free_blocks()
        pull = asyncio.ensure_future(puller.pull_prefix(agent, peer, PROMPT, lease.remote_block_ids))
        await _until(lambda: agent.transfers, "the read's start")
        await asyncio.to_thread(puller.shutdown)
        with pytest.raises(RuntimeError, match="engine stopped"):
            await pull
        await _until(lambda: agent.transfers[0].aborted, "the abort")  # asked to stop (by the transfer worker)
        assert not agent.transfers[0].landed.is_set()  # it cannot stop, so its blocks stay held
        assert puller.kv_transfers.quarantined_blocks == 6 and pool.get_num_free_blocks() == free_before - 6
        agent.land.set()
        await _until(agent.transfers[0].landed.is_set, "the late write")
    finally:
        agent.close()
        holder_agent.close()
        holder.shutdown()
