"""A KV holder in another process: an agent over a cache that a reader pulls blocks from.

The transfer benchmark and the transfer tests both need the reader and the holder in two
processes (nixl agents in one process would not show the cost of crossing them):

    conn, process = start_holder(HolderSpec(...))   # spawns the holder; the reader's end of a pipe
    handshake, cache, written = receive_holder(conn)   # its handshake (bytes), a copy of its cache, blocks with data
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
    kv_layout: str = "L,2,blocks,B,H,D"
    """Without ``model``: the synthetic cache's layout (layout.symbolic_layout), filled at random."""
    num_layers: int = 16
    """The synthetic cache's layers."""
    block_size: int = 16
    """The synthetic cache's tokens per block."""
    num_kv_heads: int = 8
    """The synthetic cache's KV heads."""
    head_dim: int = 64
    """The synthetic cache's head size."""
    dtype: str = "bfloat16"
    """The synthetic cache's element type."""

    def synthetic_shape(self) -> tuple[int, ...]:
        sizes = {"L": self.num_layers, "2": 2, "blocks": self.num_kv_blocks, "B": self.block_size,
                 "H": self.num_kv_heads, "D": self.head_dim}
        return tuple(sizes[name] for name in self.kv_layout.split(","))


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
    cache = torch.randn(spec.synthetic_shape()).to(getattr(torch, spec.dtype))
    layout = block_layout(cache, spec.kv_layout, spec.block_size, spec.num_kv_heads, spec.head_dim)
    return cache, layout, list(range(1, spec.num_kv_blocks)), None


def _hold(conn, spec: HolderSpec) -> None:
    from kvmesh.replica.kv_transfer.agent import KVTransferConfig, encode_handshake, make_kv_transfer_agent
    from kvmesh.replica.kv_transfer.errors import KVTransferError

    cache, layout, written, _engine = _holder_cache(spec)
    try:
        agent = make_kv_transfer_agent(KVTransferConfig(transport=spec.transport), spec.name, cache, layout)
    except KVTransferError as e:
        conn.send(str(e))
        return
    conn.send((encode_handshake(agent.handshake()), cache.clone(), written))
    while (command := conn.recv()) != "exit":
        if command == "die":
            os._exit(1)  # no cleanup: the reader sees a dead peer
    agent.close()
    conn.close()


def receive_holder(conn) -> tuple[bytes, object, list[int]]:
    """The holder's (handshake, cache copy, written block ids); KVTransferUnavailable when it could not start."""
    from kvmesh.replica.kv_transfer.errors import KVTransferUnavailable

    try:
        answer = conn.recv()
    except EOFError:
        raise KVTransferUnavailable("the KV holder process exited before answering (see its output)") from None
    if isinstance(answer, str):
        raise KVTransferUnavailable(f"the KV holder process could not start: {answer}")
    return answer


def start_holder(spec: HolderSpec):
    """Spawn the holder (a fresh interpreter: no state shared with the reader): (the reader's pipe end,
    the process)."""
    context = multiprocessing.get_context("spawn")
    reader, holder = context.Pipe()
    process = context.Process(target=_hold, args=(holder, spec), daemon=True)
    process.start()
    holder.close()
    return reader, process
