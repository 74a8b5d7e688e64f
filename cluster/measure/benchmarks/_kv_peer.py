"""A KV holder in another process: an agent over a cache that a reader pulls blocks from.

The transfer benchmark and the transfer tests both need the reader and the holder in two
processes (nixl agents in one process would not show the cost of crossing them):

    conn, process = start_holder(HolderSpec(...))   # spawns the holder; the reader's end of a pipe
    handshake, cache, written = conn.recv()     # its handshake (bytes), a copy of its cache, blocks with data
    ... add_peer(decode_handshake(handshake)); read_blocks(...) ...
    conn.send("exit")  (closes its agent)  or  conn.send("die")  (exits at once: a dead peer)
"""

from __future__ import annotations

import multiprocessing
import os
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HolderSpec:
    """What the holder's cache is."""

    name: str
    """The holder agent's name."""
    transport: str = "nixl"
    """KVTransferConfig.transport."""
    model: str | None = None
    """A model directory: the cache is a real engine's (stories260K), filled by generating for ``prompt``."""
    prompt: tuple[int, ...] = ()
    """Token ids the engine computes so its cache holds their blocks."""
    num_kv_blocks: int = 64
    """Blocks of the engine's cache (null block included), or of the synthetic one."""
    synthetic_shape: tuple[int, ...] = ()
    """Without ``model``: [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim] filled at random."""
    dtype: str = "float32"
    """The synthetic cache's element type."""


def _holder_cache(spec: HolderSpec):
    """(cache tensor, its layout, ids of the blocks holding data, the engine keeping it alive)."""
    import torch
    from kvmesh.replica.kv_transfer.agent import runner_layout
    from kvmesh.replica.kv_transfer.layout import block_layout

    if spec.model is not None:
        from kvmesh.replica.llm import LLM
        from kvmesh.replica.serving.sampling_params import SamplingParams

        llm = LLM(spec.model, device="cpu", num_kv_blocks=spec.num_kv_blocks)
        llm.generate([list(spec.prompt)], SamplingParams(max_tokens=4, temperature=0.0))
        runner = llm.llm_engine.model_runner
        layout = runner_layout(runner)
        per_block = runner.kv_cache.view(layout.num_regions, layout.num_blocks, -1)
        written = [b for b in range(1, layout.num_blocks) if per_block[:, b].abs().sum() > 0]
        return runner.kv_cache, layout, written, llm
    num_layers, _, num_blocks, block_size, num_kv_heads, head_dim = spec.synthetic_shape
    cache = torch.randn(spec.synthetic_shape).to(getattr(torch, spec.dtype))
    layout = block_layout(cache, "L,2,blocks,B,H,D", block_size, num_kv_heads, head_dim)
    return cache, layout, list(range(1, num_blocks)), None


def _hold(conn, spec: HolderSpec) -> None:
    from kvmesh.replica.kv_transfer.agent import KVTransferConfig, encode_handshake, make_kv_transfer_agent

    cache, layout, written, _engine = _holder_cache(spec)
    agent = make_kv_transfer_agent(KVTransferConfig(transport=spec.transport), spec.name, cache, layout)
    conn.send((encode_handshake(agent.handshake()), cache.clone(), written))
    while (command := conn.recv()) != "exit":
        if command == "die":
            os._exit(1)  # no cleanup: the reader sees a dead peer
    agent.close()
    conn.close()


def start_holder(spec: HolderSpec):
    """Spawn the holder (a fresh interpreter: no state shared with the reader): (the reader's pipe end,
    the process)."""
    context = multiprocessing.get_context("spawn")
    reader, holder = context.Pipe()
    process = context.Process(target=_hold, args=(holder, spec), daemon=True)
    process.start()
    holder.close()
    return reader, process
