"""The whole run: resolve device, preset and model, measure each configuration, then HF generate and
the weight-read floor once; write results/engine_<device>.json and the plot beside it."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
from pathlib import Path

import torch
from kvmesh.cluster.measure.benchmarks.engine_speed.bandwidth import weight_read_floor
from kvmesh.cluster.measure.benchmarks.engine_speed.hf_baseline import (
    hf_decode_ms,
    hf_workload,
    load_hf_model,
)
from kvmesh.cluster.measure.benchmarks.engine_speed.measure import Plan, free_engine, measure_variant
from kvmesh.cluster.measure.benchmarks.engine_speed.model_files import ensure_model, weight_file_bytes
from kvmesh.cluster.measure.benchmarks.engine_speed.options import EngineSpeedOptions
from kvmesh.cluster.measure.benchmarks.engine_speed.presets import PRESETS, Preset
from kvmesh.cluster.measure.benchmarks.engine_speed.ttft import NEW_TOKENS
from kvmesh.cluster.measure.benchmarks.engine_speed.variants import DEFAULT
from kvmesh.cluster.measure.benchmarks.engine_speed.workload import make_workload


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda but torch sees no CUDA device here; use --device cpu (with --preset tiny)")
    return torch.device(name)


def make_plan(options: EngineSpeedOptions, preset: Preset, device: torch.device) -> Plan:
    model_dir = options.model or str(ensure_model(preset, options.model_cache_dir, options.seed))
    config_path = Path(model_dir) / "config.json"
    if not config_path.exists():
        raise ValueError(f"--model {model_dir!r} has no config.json; pass a Hugging Face model directory")
    hf = json.loads(config_path.read_text())
    batches = options.batches() or preset.decode_batches
    num_requests = options.num_requests or preset.num_requests
    plan = Plan(
        model_dir=model_dir, device=device,
        workload=make_workload(options.seed, num_requests, preset.prompt_len,
                               preset.output_len, hf["vocab_size"]),
        decode_batches=batches, decode_context=preset.decode_context, warmup_steps=options.warmup_steps,
        decode_steps=options.decode_steps, ttft_prefix_len=options.ttft_prefix_len or preset.ttft_prefix_len,
        ttft_repeats=options.ttft_repeats, seed=options.seed,
        engine_config=dict(max_num_seqs=max(num_requests, *batches),
                           max_num_batched_tokens=options.max_num_batched_tokens or preset.max_num_batched_tokens,
                           gpu_memory_utilization=options.gpu_memory_utilization,
                           # on cuda kv_cache_memory would cap the cache: there gpu_memory_utilization sizes it
                           kv_cache_memory=options.kv_cache_memory if device.type == "cpu" else None,
                           seed=options.seed))
    longest = max(preset.prompt_len[1] + preset.output_len[1], plan.ttft_prefix_len + NEW_TOKENS + 1)
    if longest > hf["max_position_embeddings"]:
        raise ValueError(f"the workload needs {longest}-token sequences; the model's max_position_embeddings is "
                         f"{hf['max_position_embeddings']} (lower --ttft-prefix-len or use a longer model)")
    return plan


def measure_hf(options: EngineSpeedOptions, preset: Preset, plan: Plan, dtype: torch.dtype) -> dict:
    """HF generate on the same weights, in the dtype the engines ran in."""
    print("[engine-speed] HF generate: loading the model", flush=True)
    model = load_hf_model(plan.model_dir, dtype, plan.device)
    try:
        vocab = model.config.vocab_size
        return {"dtype": str(dtype).removeprefix("torch."), "attn_implementation": "sdpa",
                "workload": hf_workload(model, plan.workload, options.hf_batch_size or preset.hf_batch_size,
                                        plan.device),
                "decode": [hf_decode_ms(model, b, plan.decode_context, plan.warmup_steps, plan.decode_steps, vocab,
                                        plan.seed, plan.device) for b in plan.decode_batches]}
    finally:
        del model
        free_engine(plan.device)


def environment(device: torch.device) -> dict:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                timeout=5).stdout.strip() or None
    except OSError:
        commit = None
    return {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "commit": commit,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "cpu_count": os.cpu_count(), "load_avg_start": os.getloadavg()}


def run(options: EngineSpeedOptions) -> dict:
    device = resolve_device(options.device)
    preset = PRESETS[options.preset or ("tinyllama-1.1b" if device.type == "cuda" else "tiny")]
    plan = make_plan(options, preset, device)
    results: dict = {"bench": "engine-speed", "options": {k: getattr(options, k) for k in options.__dataclass_fields__},
                     "preset": preset.name, "model_dir": plan.model_dir, "weight_file_bytes": weight_file_bytes(
                         plan.model_dir), "environment": environment(device),
                     "workload": {"num_requests": len(plan.workload.prompts), "prompt_len": preset.prompt_len,
                                  "output_len": preset.output_len, "prompt_tokens": plan.workload.prompt_tokens,
                                  "output_tokens": plan.workload.output_tokens},
                     "engine_config": plan.engine_config, "configs": []}
    for variant in [DEFAULT, *options.variants()]:
        results["configs"].append(measure_variant(plan, variant))
    measured = [c for c in results["configs"] if "workload" in c and "error" not in c]
    if not measured:
        raise ValueError("no engine configuration could run here: "
                         + "; ".join(f"{c['config']}: {c.get('skipped') or c.get('error')}"
                                     for c in results["configs"]))
    dtype = getattr(torch, measured[0]["dtype"])
    if not options.skip_hf:
        results["hf_generate"] = measure_hf(options, preset, plan, dtype)
    results["weight_read_floor"] = weight_read_floor(measured[0]["weight_bytes"], device)
    results["environment"].update(load_avg_end=os.getloadavg(), torch_threads=torch.get_num_threads())
    out = Path(options.out or f"results/engine_{device.type}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    from kvmesh.cluster.measure.benchmarks.engine_speed.plot import plot
    from kvmesh.cluster.measure.benchmarks.engine_speed.report import summary_table

    plot(results, out.with_suffix(".png"))
    print(summary_table(results))
    print(f"[engine-speed] wrote {out} and {out.with_suffix('.png')}", flush=True)
    return results
