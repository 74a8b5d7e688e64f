"""Whole-engine runs the GPU tests and their CPU twins share: a workload that preempts and chunks, a run
that records what the step took (preemptions, prefill chunks, static decode steps), and the CUDA
configurations to parametrize over (every attention backend, block size and CUDA-graph setting),
skipped with the engine's own reason where a combination cannot run."""

from __future__ import annotations

import gc
import random
import sys
from dataclasses import dataclass, field

import pytest
import torch
from kvmesh.replica.attention.backend import available_backends, get_attn_backend
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.engine.engine_request import EngineRequest
from kvmesh.replica.engine.llm_engine import LLMEngine
from kvmesh.replica.serving.sampling_params import SamplingParams
from kvmesh.replica.worker.graphs.cuda_graph import supports_static_decode

BLOCK_SIZES = (16, 256)
"""vLLM's default block and flash-attn's paged-cache granule."""
CUDA_BACKENDS = available_backends()
"""Every registered attention backend (each GPU test skips, with its reason, one that cannot run there)."""


@dataclass
class Run:
    """One engine run: every request's tokens and what the steps did."""

    tokens: dict[str, list[int]] = field(default_factory=dict)
    partial_chunks: int = 0
    """Prefill chunks that stopped short of their prompt's end."""
    static_steps: int = 0
    """Decode steps that went through the static (CUDA-graph) path."""
    replays: int = 0
    """Of those, steps replayed from a captured graph."""
    num_preemptions: int = 0


def waves(block_size: int, seed: int = 0) -> tuple[list[dict[str, list[int]]], dict[str, int]]:
    """Two waves of prompts a little shorter than a whole number of blocks (decoding then needs a new block,
    where a full pool preempts; long prompts chunk under a small token budget) and each request's output
    length (the first wave's long enough to decode while the second prefills)."""
    rng = random.Random(seed + block_size)
    base = -(-100 // block_size) * block_size - 10  # 102 at block 16, 246 at block 256
    first = {f"a{i}": [rng.randrange(3, 512) for _ in range(base - 3 * i)] for i in range(2)}
    second = {f"b{i}": [rng.randrange(3, 512) for _ in range(base - 5 - 4 * i)] for i in range(3)}
    lengths = {rid: 24 + 3 * i for i, rid in enumerate(first)} | {rid: 9 + 4 * i for i, rid in enumerate(second)}
    return [first, second], lengths


def pool_that_preempts(block_size: int, prompts: list[dict[str, list[int]]], lengths: dict[str, int]) -> int:
    """num_kv_blocks that holds the largest request but half of all of them at once (so some are preempted)."""
    need = {rid: -(-(len(p) + lengths[rid]) // block_size) for wave in prompts for rid, p in wave.items()}
    return 1 + max(max(need.values()), sum(need.values()) // 2)


def run(engine: LLMEngine, prompts: list[dict[str, list[int]]], lengths: dict[str, int],
        steps_between_waves: int = 6) -> Run:
    """Greedy tokens of every request; a wave joins ``steps_between_waves`` steps after the one before."""
    out = Run()
    runner = engine.model_runner
    execute = runner.execute_model

    def counting(step):
        out.partial_chunks += sum(not sr.sample for sr in step.scheduled)
        return execute(step)

    runner.execute_model = counting
    static = runner.static_decode
    if static is not None:
        static_run = static.run

        def counting_static(n, sampling=None):
            out.static_steps += 1
            out.replays += (static.size_for(n), sampling) in static.graphs
            return static_run(n, sampling)

        static.run = counting_static
    for i, wave in enumerate(prompts):
        for rid, prompt in wave.items():
            engine.add_request(EngineRequest(rid, prompt,
                                             SamplingParams(temperature=0.0, max_tokens=lengths[rid], ignore_eos=True)))
        for _ in range(steps_between_waves if i + 1 < len(prompts) else 1 << 30):
            if not engine.has_unfinished_requests():
                break
            for o in engine.step():
                if o.finished:
                    out.tokens[o.request_id] = o.output_token_ids
    out.num_preemptions = engine.stats.num_preemptions
    return out


def flash_reference(monkeypatch) -> None:
    """flash_attn = the plain-torch reference (float32 allowed), so the flash backend runs on CPU."""
    import transformers.integrations.flash_attention  # noqa: F401  (probes flash_attn before the stand-in)
    from kvmesh.replica.attention import flash_attn_reference

    monkeypatch.setitem(sys.modules, "flash_attn", flash_attn_reference.as_module(allow_float32=True))


def cuda_dtype_or_skip(backend: str, block_size: int, cuda_graphs: bool) -> str:
    """The dtype ``backend`` runs on CUDA (float32 where it can, else bfloat16); skips, with the engine's
    reason, a backend that cannot run here or has no static decode path at ``block_size`` for graphs."""
    device, problems = torch.device("cuda"), []
    for dtype in (torch.float32, torch.bfloat16):
        try:
            attn = get_attn_backend(backend, device, dtype)
        except ValueError as e:
            problems.append(str(e))
            continue
        if cuda_graphs and not supports_static_decode(attn, block_size):
            pytest.skip(f"attention backend {backend!r} has no static decode path at block_size={block_size}")
        return str(dtype).removeprefix("torch.")
    pytest.skip("; ".join(problems))


def free_cuda_memory() -> None:
    """Give the memory of engines no longer referenced back (their runners hold reference cycles) before
    the next engine sizes its cache."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def config(stories_path, **kw) -> EngineConfig:
    kw.setdefault("kv_cache_memory", 32 << 20)
    return EngineConfig(model=str(stories_path), hash_seed=b"s", max_num_seqs=8, **kw)
