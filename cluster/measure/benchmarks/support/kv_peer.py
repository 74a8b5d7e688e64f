"""A KV holder in another process: an agent over a cache that a reader pulls blocks from.

The transfer benchmark and the transfer tests both need the reader and the holder in two
processes (nixl agents in one process would not show the cost of crossing them):

    conn, process = start_holder(HolderSpec(...))   # spawns the holder; the reader's end of a pipe
    ready = receive_holder(conn)                    # HolderReady: its handshake, a copy of its cache, ...
    ... add_peer(decode_handshake(ready.handshake)); read_blocks(...) or pull_prefix(...) ...
    conn.send("exit")  (closes its agent)  or  conn.send("die")  (exits at once: a dead peer)
"""

from __future__ import annotations

import multiprocessing
import os
from dataclasses import dataclass, field, replace
from typing import Any


@dataclass(frozen=True, slots=True)
class HolderSpec:
    """What the holder's cache is."""

    name: str
    """The holder agent's name."""
    transport: str = "nixl"
    """KVTransferConfig.transport."""
    progress_delay_us: int = 1000
    """KVTransferConfig.progress_delay_us (nixl's progress thread)."""
    model: str | None = None
    """A model directory: the cache is a real engine's (stories260K), filled by generating for ``prompt``."""
    prompt: tuple[int, ...] = ()
    """Token ids the engine computes so its cache holds their blocks."""
    max_tokens: int = 4
    """Greedy tokens the engine generates after ``prompt``."""
    hash_seed: str | None = None
    """The engine's hash seed (a puller must hash alike: the cluster's shared seed)."""
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


@dataclass(frozen=True, slots=True)
class HolderReady:
    """What the holder sends once its agent is up."""

    handshake: bytes
    """Its encoded KVHandshake."""
    cache: Any
    """A copy of its cache tensor (to compare what was read with)."""
    written: list[int]
    """Ids of the blocks holding data."""
    prefix_block_ids: list[int] = field(default_factory=list)
    """With a model: the cached leading blocks of the prompt, in order (what a puller reads)."""
    output_token_ids: list[int] = field(default_factory=list)
    """With a model: the greedy tokens its engine generated for the prompt."""


def _holder_cache(spec: HolderSpec):
    """(cache tensor, its layout, a HolderReady without the handshake, the engine keeping the cache alive)."""
    import torch
    from kvmesh.replica.kv_layout import block_layout

    if spec.model is not None:
        from kvmesh.replica.kv_transfer.prefix_pull import cached_prefix_block_ids
        from kvmesh.replica.llm import LLM
        from kvmesh.replica.serving.sampling_params import SamplingParams

        llm = LLM(spec.model, device="cpu", num_kv_blocks=spec.num_kv_blocks, hash_seed=spec.hash_seed)
        (out,) = llm.generate([list(spec.prompt)], SamplingParams(max_tokens=spec.max_tokens, temperature=0.0))
        runner = llm.llm_engine.model_runner
        layout = runner.kv_layout
        per_block = runner.kv_cache.view(layout.num_regions, layout.num_blocks, -1)
        written = [b for b in range(1, layout.num_blocks) if per_block[:, b].abs().sum() > 0]
        prefix = cached_prefix_block_ids(llm.llm_engine.kv_cache_manager, list(spec.prompt))
        ready = HolderReady(b"", runner.kv_cache.clone(), written, prefix, list(out.output_token_ids))
        return runner.kv_cache, layout, ready, llm
    cache = torch.randn(spec.synthetic_shape()).to(getattr(torch, spec.dtype))
    layout = block_layout(cache, spec.kv_layout, spec.block_size, spec.num_kv_heads, spec.head_dim)
    return cache, layout, HolderReady(b"", cache.clone(), list(range(1, spec.num_kv_blocks))), None


def _hold(conn, spec: HolderSpec) -> None:
    from kvmesh.replica.kv_transfer.agent import KVTransferConfig, encode_handshake, make_kv_transfer_agent
    from kvmesh.replica.kv_transfer.errors import KVTransferError

    cache, layout, ready, _engine = _holder_cache(spec)
    try:
        agent = make_kv_transfer_agent(
            KVTransferConfig(transport=spec.transport, progress_delay_us=spec.progress_delay_us), spec.name, cache,
            layout)
    except KVTransferError as e:
        conn.send(str(e))
        return
    conn.send(replace(ready, handshake=encode_handshake(agent.handshake())))
    while (command := conn.recv()) != "exit":
        if command == "die":
            os._exit(1)  # no cleanup: the reader sees a dead peer
    agent.close()
    conn.close()


def receive_holder(conn) -> HolderReady:
    """The holder's HolderReady; KVTransferUnavailable when it could not start."""
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
