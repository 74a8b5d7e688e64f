"""The FP8 KV cache against the model-dtype cache: the blocks a GiB holds, the text's agreement, the hit rate.

    kvmesh bench fp8-kv-cache [--model ../shared/models/stories260K/hf] [--tokens 4096]
                              [--trace ../shared/traces/mooncake_synthetic_trace.jsonl] [--out
                              results/fp8_kv_cache.json]

capacity   KV blocks per GiB: a stories260K replica's own sizing of a 64 MiB cache per dtype (scaled to a GiB),
           and the arithmetic of the simulator's 8B Llama-3 (32 layers x 8 KV heads x 128, bf16 vs FP8).
agreement  text sampled from the model with its model-dtype cache (seeded, temperature 1) is read back
           teacher-forced (prompt logprobs) by one replica per cache dtype: the share of positions whose top-1
           token agrees with the model-dtype cache's, and the mean |logprob difference| of the text's tokens.
hit rate   ``kvmesh sim`` (cache_aware, 16 replicas) on the Mooncake trace, each replica given the same KV memory:
           the blocks each dtype fits in it, and the prefix hit rate those blocks buy.

Runs on the CPU with the torch attention backend (the model's dtype there is float32): CPU figures.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from kvmesh.replica.engine.engine_request import EngineRequest

DTYPES = ("auto", "fp8_e4m3", "fp8_e5m2")
PROMPTS = ("Once upon a time", "The little dog", "Lily and Tom went to the park", "One day, a big bird",
           "Sam had a red ball", "The sun was hot and", "Mom said", "There was a small cat")
LLAMA3_8B = dict(layers=32, kv_heads=8, head_dim=128, block_size=16)
GIB = 1 << 30


def parse_args(argv):
    p = argparse.ArgumentParser(prog="kvmesh bench fp8-kv-cache", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="../shared/models/stories260K/hf", help="a Hugging Face model directory")
    p.add_argument("--tokens", type=int, default=4096, help="teacher-forced tokens compared (about)")
    p.add_argument("--trace", default="../shared/traces/mooncake_synthetic_trace.jsonl", help="Mooncake trace")
    p.add_argument("--sim-memory", default="24GiB", help="KV cache per simulated replica (both dtypes)")
    p.add_argument("--out", default="results/fp8_kv_cache.json")
    return p.parse_args(argv)


def _engine(model: str, kv_cache_dtype: str, memory: str = "64MiB", dtype: str = "auto"):
    from kvmesh.replica.config import EngineConfig
    from kvmesh.replica.engine.llm_engine import LLMEngine

    return LLMEngine(EngineConfig(model=model, device="cpu", kv_cache_dtype=kv_cache_dtype, kv_cache_memory=memory,
                                  max_model_len=1024, dtype=dtype))


def capacity(model: str) -> dict:
    """Blocks per GiB per dtype: measured on the model's replica, and computed for Llama-3 8B."""
    import torch
    from kvmesh.replica.worker.kv_cache import bytes_per_block

    measured = {}
    for dtype in (*DTYPES, "bfloat16"):  # the last: a model-dtype cache of the model run in bf16
        runner = (_engine(model, "auto", dtype="bfloat16") if dtype == "bfloat16" else _engine(model,
                                                                                               dtype)).model_runner
        measured[dtype] = {"kv_cache_dtype": str(runner.kv_cache.dtype).removeprefix("torch."),
                           "bytes_per_block": runner.kv_layout.bytes_per_block,
                           "blocks_per_gib": runner.num_kv_blocks * GIB // (64 << 20)}
    shape = LLAMA3_8B
    llama = {name: GIB // bytes_per_block(shape["layers"], shape["block_size"], shape["kv_heads"], shape["head_dim"], t)
             for name, t in (("bfloat16", torch.bfloat16), ("fp8", torch.float8_e4m3fn))}
    return {"model": measured, "llama3_8b_blocks_per_gib": llama}


def sampled_text(model: str, tokens: int) -> list[list[int]]:
    """Prompt + sampled continuation per prompt (model-dtype cache), about ``tokens`` tokens in all."""
    from kvmesh.replica.serving.sampling_params import SamplingParams
    from kvmesh.replica.serving.tokenizer import load_tokenizer

    engine, tokenizer = _engine(model, "auto"), load_tokenizer(model)
    per = max(16, tokens // len(PROMPTS))
    for i, text in enumerate(PROMPTS):
        engine.add_request(EngineRequest(str(i), tokenizer.encode(text),
                           SamplingParams(temperature=1.0, seed=i, max_tokens=per, ignore_eos=True)))
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.prompt_token_ids + out.output_token_ids
    return [done[str(i)] for i in range(len(PROMPTS))]


def teacher_forced(model: str, kv_cache_dtype: str, texts: list[list[int]]) -> list[list]:
    """Every text's prompt logprobs (the token there and the top-1) read by a replica of ``kv_cache_dtype``."""
    from kvmesh.replica.serving.sampling_params import SamplingParams

    engine, done = _engine(model, kv_cache_dtype), {}
    for i, text in enumerate(texts):
        engine.add_request(EngineRequest(str(i), text,
                                         SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1)))
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.prompt_logprobs is not None:
                done[out.request_id] = out.prompt_logprobs
    return [done[str(i)][1:] for i in range(len(texts))]


def agreement(model: str, tokens: int) -> dict:
    texts = sampled_text(model, tokens)
    reference = teacher_forced(model, "auto", texts)
    result = {"positions": sum(len(r) for r in reference)}
    for dtype in DTYPES[1:]:
        got = teacher_forced(model, dtype, texts)
        pairs = [(a, b) for ref, fp8 in zip(reference, got, strict=True) for a, b in zip(ref, fp8, strict=True)]
        diffs = sorted(abs(a.logprob - b.logprob) for a, b in pairs)
        result[dtype] = {"top1_agreement": sum(a.token_ids[1] == b.token_ids[1] for a, b in pairs) / len(pairs),
                         "mean_abs_logprob_diff": statistics.fmean(diffs),
                         "p99_abs_logprob_diff": diffs[int(0.99 * (len(diffs) - 1))], "max_abs_logprob_diff": diffs[-1]}
    return result


def hit_rates(trace: str, memory: str) -> dict:
    """``kvmesh sim`` once per cache dtype with the same KV memory per replica."""
    from kvmesh.cluster.cli import main as kvmesh

    runs = {}
    for dtype in ("auto", "fp8"):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "sim.json"
            code = kvmesh(["sim", "--trace", trace, "--policies", "cache_aware", "--kv-cache-memory-per-replica",
                           memory, "--kv-cache-dtype", dtype, "--miniature", "16", "--no-ceilings", "--no-plot",
                           "--no-progress", "--out", str(out)])
            if code:
                raise SystemExit(f"kvmesh sim failed ({code}) for kv_cache_dtype {dtype}")
            report = json.loads(out.read_text())
        run = report["policies"]["cache_aware"]
        runs[dtype] = {"blocks_per_replica": report["blocks_per_replica"], "hit_rate": run["hit_rate"],
                       "ttft_p50_s": run["ttft_s"]["p50"], "ttft_p99_s": run["ttft_s"]["p99"]}
    return {"memory_per_replica": memory, "policy": "cache_aware", "trace": trace, "runs": runs}


def table(result: dict) -> str:
    """BENCHMARKS.md's FP8 table (``kvmesh bench report``'s ``fp8_kv_cache`` kind)."""
    cap, agree, sim = result["capacity"], result["agreement"], result["hit_rate"]["runs"]
    names = {"auto": "model dtype (float32 on the CPU)", "fp8_e4m3": "fp8 (E4M3)", "fp8_e5m2": "fp8_e5m2",
             "bfloat16": "model dtype, the model in bf16"}
    lines = ["| KV cache | blocks per GiB (stories260K) | top-1 agreement | mean \\|logprob diff\\| | p99 |",
             "|---|---|---|---|---|"]
    for dtype in ("auto", "bfloat16", *DTYPES[1:]):
        row = agree.get(dtype)
        figures = ["(reference)" if dtype == "auto" else "-", "-", "-"] if row is None else [
            f"{row['top1_agreement']:.2%}", f"{row['mean_abs_logprob_diff']:.4f}", f"{row['p99_abs_logprob_diff']:.4f}"]
        lines.append(f"| {names[dtype]} | {cap['model'][dtype]['blocks_per_gib']:,} | " + " | ".join(figures) + " |")
    llama = cap["llama3_8b_blocks_per_gib"]
    lines += ["", f"Over {agree['positions']:,} teacher-forced positions (CPU). Llama-3 8B, 16-token blocks: "
              f"{llama['bfloat16']:,} blocks per GiB in bf16, {llama['fp8']:,} in FP8.", "",
              "| simulated KV cache (same memory per replica) | blocks per replica | prefix hit rate | TTFT p50 | TTFT "
              "p99 |",
              "|---|---|---|---|---|"]
    for dtype, run in sim.items():
        lines.append(f"| {'bf16' if dtype == 'auto' else 'fp8'} | {run['blocks_per_replica']:,} | "
                     f"{run['hit_rate']:.1%} "
                     f"| {run['ttft_p50_s']:.3f} s | {run['ttft_p99_s']:.3f} s |")
    return "\n".join(lines)


def aot_table(result: dict) -> str:
    """BENCHMARKS.md's table of the attention kernels compiled for sm_90 with and without an FP8 cache
    (``python tests/replica/triton_aot.py --out results/triton_aot.json``; ``kvmesh bench report``'s ``fp8_aot``)."""
    lines = ["| case | kernel | registers | spills | shared B | occupancy | FP8 conversions |",
             "|---|---|---|---|---|---|---|"]
    twins = ("decode B=1", "decode B=64", "prefill 512-token chunk")
    for row in result["rows"]:
        case_shown = row["case"].startswith("FP8") or row["case"] in twins
        if row["target"] == "sm_90" and case_shown and row["kernel"] in ("_unified_attention_kernel",
                                                                          "_rotary_and_cache_kernel"):
            cvt = ", ".join(f"`{c}`" for c in row["fp8_cvt"]) or "-"
            lines.append(f"| {row['case']} | {row['kernel'].strip('_')} | {row['registers']} | {row['spill_bytes']} | "
                         f"{row['shared']:,} | {row['occupancy']:.0%} | {cvt} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    result = {"machine": {"cpu": platform.processor() or platform.machine(), "python": platform.python_version(),
                          "device": "cpu"},
              "model": args.model, "capacity": capacity(args.model), "agreement": agreement(args.model, args.tokens),
              "hit_rate": hit_rates(args.trace, args.sim_memory)}
    result["wall_s"] = round(time.perf_counter() - start, 1)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
