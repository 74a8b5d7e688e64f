"""One engine configuration, measured: build the engine, run the workload, time decode steps and TTFT.

A configuration this machine cannot run (flash-attn not installed, CUDA graphs on a CPU, a backend
that refuses the block size) is skipped with the reason, and the run goes on with the next one.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

import torch
from kvmesh.cluster.measure.benchmarks.engine_speed.bandwidth import model_weight_bytes
from kvmesh.cluster.measure.benchmarks.engine_speed.decode import decode_step_times
from kvmesh.cluster.measure.benchmarks.engine_speed.timing import Clock
from kvmesh.cluster.measure.benchmarks.engine_speed.ttft import ttft
from kvmesh.cluster.measure.benchmarks.engine_speed.variants import EngineVariant
from kvmesh.cluster.measure.benchmarks.engine_speed.workload import SpeedWorkload, run_workload, warm_up


@dataclass(frozen=True)
class Plan:
    """What every configuration of one run measures (resolved from the options and the preset)."""

    model_dir: str
    """The model every engine loads."""
    device: torch.device
    """Where the engines run."""
    workload: SpeedWorkload
    """The throughput workload."""
    decode_batches: tuple[int, ...]
    """Running sequences at which decode steps are timed."""
    decode_context: int
    """Prompt tokens of each decoding sequence."""
    warmup_steps: int
    """Untimed decode steps."""
    decode_steps: int
    """Timed decode steps per batch size."""
    ttft_prefix_len: int
    """Prefix of the TTFT measurement."""
    ttft_repeats: int
    """TTFT repeats (medians reported)."""
    engine_config: dict
    """EngineConfig fields every configuration shares (budgets, memory, seed)."""
    seed: int
    """Seed of the random token ids."""


def skip_reason(variant: EngineVariant, device: torch.device) -> str | None:
    """Why ``variant`` cannot run on ``device`` (checked before building anything), or None."""
    from kvmesh.replica.attention.backend import flash_attn_problem

    if variant.cuda_graphs and device.type != "cuda":
        return f"CUDA graphs need a CUDA device; this run is on {device.type}"
    if variant.backend == "flash_attn":
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32  # what dtype="auto" runs in
        return flash_attn_problem(device, dtype)
    return None


def build_engine(plan: Plan, variant: EngineVariant):
    from kvmesh.replica.config import EngineConfig
    from kvmesh.replica.engine.llm_engine import LLMEngine

    config = EngineConfig(model=plan.model_dir, device=plan.device.type, **plan.engine_config,
                          **variant.engine_kwargs())
    return LLMEngine(config, skip_tokenizer_init=True)  # token ids in and out: no tokenizer needed


def free_engine(device: torch.device) -> None:
    """Give the last engine's memory back before the next one sizes its KV cache from what is free
    (on CPU the next engine takes its fixed kv_cache_memory; a full collection there costs ~0.4 s)."""
    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()


def measure_variant(plan: Plan, variant: EngineVariant) -> dict:
    """Every measurement of one configuration, or the reason it was skipped (or failed)."""
    label = variant.label
    result: dict = {"config": label}
    reason = skip_reason(variant, plan.device)
    if reason is not None:
        print(f"[engine-speed] skip {label}: {reason}", flush=True)
        return {**result, "skipped": reason}
    print(f"[engine-speed] {label}: building the engine", flush=True)
    clock = Clock(plan.device)
    failure = None
    try:
        engine = build_engine(plan, variant)
    except (ValueError, RuntimeError) as e:  # the engine refused this combination here, or ran out of memory
        failure = ("skipped" if isinstance(e, ValueError) else "error", str(e))
    if failure is not None:  # outside the except: its traceback no longer holds the half-built model
        free_engine(plan.device)
        print(f"[engine-speed] {failure[0]} {label}: {failure[1]}", flush=True)
        return {**result, failure[0]: failure[1]}
    runner = engine.model_runner
    result.update(backend=runner.attn_backend.name, block_size=engine.config.block_size,
                  cuda_graphs=engine.config.cuda_graphs, dtype=str(runner.dtype).removeprefix("torch."),
                  num_kv_blocks=engine.num_kv_blocks, weight_bytes=model_weight_bytes(runner.model),
                  build_s=clock.read()["wall_s"])
    try:
        result.update(_measure(engine, plan, label))
    except RuntimeError as e:  # out of device memory, a kernel failure: keep what was measured, go on
        print(f"[engine-speed] {label} failed: {e}", flush=True)
        return {**result, "error": str(e)}
    finally:
        del engine, runner
        free_engine(plan.device)
    print(f"[engine-speed] {label}: {result['workload']['output_tok_per_s']:.0f} output tok/s, decode ms/step "
          + " / ".join(f"{d['wall_ms_per_step']:.2f}@{d['running_seqs']}" for d in result["decode"])
          + f", TTFT cold {result['ttft']['cold']['wall_ms']:.1f} ms / cached "
            f"{result['ttft']['cached']['wall_ms']:.1f} ms",
          flush=True)
    return result


def _measure(engine, plan: Plan, label: str) -> dict:
    from tqdm import tqdm

    out: dict = {"decode": []}
    phases = ["warm-up", "workload", *(f"decode@{b}" for b in plan.decode_batches), "ttft"]
    with tqdm(phases, desc=label, unit="phase") as bar:
        for phase in bar:
            bar.set_postfix_str(phase)
            if phase == "warm-up":
                warm_up(engine, engine.vocab_size)
            elif phase == "workload":
                out["workload"] = run_workload(engine, plan.workload, plan.device, label)
            elif phase == "ttft":
                out["ttft"] = ttft(engine, plan.ttft_prefix_len, plan.ttft_repeats, plan.seed, plan.device)
            else:
                out["decode"].append(decode_step_times(
                    engine, int(phase.removeprefix("decode@")), plan.decode_context, plan.warmup_steps,
                    plan.decode_steps, engine.config.max_num_batched_tokens, plan.seed, plan.device))
    return out
