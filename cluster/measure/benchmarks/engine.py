"""Engine benchmarks on CPU: ``kvmesh bench engine`` (results/engine.json + results/engine.png).

    throughput         64 requests of mixed lengths through the engine vs HF ``generate`` in static,
                       left-padded batches -- same weights (one HF random init saved to disk), same dtype
    cached_ttft        TTFT of a request whose long prefix is in the prefix cache vs the same cold
    caching_overhead   a 0%-hit workload with prefix caching on vs off (interleaved repeats, median)
    step_overhead      per-step engine time outside the model forward with 256 running sequences

Times are wall clock and process CPU time; on a shared machine CPU time is the steadier measure
(one torch thread by default, so CPU time is the work done). Model forward = the model's
``forward`` + ``compute_logits``; everything else in a step is engine overhead.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

from kvmesh.cluster.measure.benchmarks.support.engines import make_engine
from kvmesh.cluster.measure.benchmarks.support.step_overhead import TINY, bench_step_overhead
from kvmesh.replica.engine.engine_request import EngineRequest

MODEL = dict(model_type="llama", hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
             num_attention_heads=8, num_key_value_heads=2, vocab_size=32000, max_position_embeddings=4096)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="kvmesh bench engine", description=__doc__.split("\n")[0], allow_abbrev=False,
                                epilog="Per device and engine configuration (--device cuda): kvmesh bench engine-speed")
    p.add_argument("--out", default="results/engine.json")
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--prompt-len", type=int, nargs=2, default=[64, 1024], metavar=("MIN", "MAX"))
    p.add_argument("--output-len", type=int, nargs=2, default=[16, 256], metavar=("MIN", "MAX"))
    p.add_argument("--hf-batch-size", type=int, default=16, help="static batch size of the HF baseline")
    p.add_argument("--prefix-len", type=int, default=2048, help="cached prefix of the TTFT benchmark")
    p.add_argument("--overhead-seqs", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3, help="interleaved repeats of the caching on/off runs")
    p.add_argument("--threads", type=int, default=1, help="torch threads (both engines)")
    p.add_argument("--skip", nargs="*", default=[], choices=["throughput", "cached_ttft", "caching_overhead",
                                                               "step_overhead"])
    return p.parse_args(argv)


class WallCpuClock:
    """Wall and process-CPU seconds since start."""

    def __init__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def read(self) -> dict[str, float]:
        return {"wall_s": time.perf_counter() - self.wall, "cpu_s": time.process_time() - self.cpu}


def run_engine(engine, prompts, lengths, tag="r") -> dict:
    """Add every request at once and step until all finish; returns times and token counts."""
    from kvmesh.replica.serving.sampling_params import SamplingParams

    clock = WallCpuClock()
    for i, (p, n) in enumerate(zip(prompts, lengths, strict=True)):
        engine.add_request(EngineRequest(f"{tag}{i}", p,
                                         SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)))
    steps = generated = 0
    while engine.has_unfinished_requests():
        generated += sum(len(o.new_token_ids) for o in engine.step())
        steps += 1
    assert generated == sum(lengths), (generated, sum(lengths))
    return {**clock.read(), "steps": steps, "output_tokens": generated}


def workload(rng, n, prompt_len, output_len, vocab):
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randint(*prompt_len))] for _ in range(n)]
    return prompts, [rng.randint(*output_len) for _ in range(n)]


def bench_throughput(model_dir: str, args) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    prompts, lengths = workload(random.Random(0), args.num_requests, args.prompt_len, args.output_len,
                                MODEL["vocab_size"])
    engine = make_engine(model_dir, max_num_seqs=max(64, args.num_requests))
    run_engine(engine, [[5, 6, 7]], [2], tag="warm")
    ours = run_engine(engine, prompts, lengths)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    clock = WallCpuClock()
    for s in range(0, len(prompts), args.hf_batch_size):
        batch, outs = prompts[s:s + args.hf_batch_size], lengths[s:s + args.hf_batch_size]
        width = max(map(len, batch))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in batch])  # [B, width], left-padded
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        with torch.inference_mode():
            hf.generate(ids, attention_mask=mask, max_new_tokens=max(outs), min_new_tokens=max(outs),
                        do_sample=False)
        print(f"  hf batch {s // args.hf_batch_size + 1}: {clock.read()['wall_s']:.1f}s", flush=True)
    base = {**clock.read(), "output_tokens": sum(lengths)}
    for r in (ours, base):
        r["output_tok_per_s_wall"] = r["output_tokens"] / r["wall_s"]
        r["output_tok_per_s_cpu"] = r["output_tokens"] / r["cpu_s"]
    return {"engine": ours, "hf_static_batches": base, "hf_batch_size": args.hf_batch_size,
            "speedup_wall": ours["output_tok_per_s_wall"] / base["output_tok_per_s_wall"],
            "speedup_cpu": ours["output_tok_per_s_cpu"] / base["output_tok_per_s_cpu"],
            "prompt_tokens": sum(map(len, prompts)), "target": ">= 3x"}


def time_to_first_token(engine, rid, prompt) -> dict:
    from kvmesh.replica.serving.sampling_params import SamplingParams

    clock = WallCpuClock()
    engine.add_request(EngineRequest(rid, prompt, SamplingParams(temperature=0.0, max_tokens=1)))
    cached = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            cached = out.num_cached_tokens
    return {**clock.read(), "num_cached_tokens": cached}


def bench_cached_ttft(model_dir: str, args) -> dict:
    rng = random.Random(1)
    engine = make_engine(model_dir)
    run_engine(engine, [[5, 6, 7]], [2], tag="warm")
    prefix = [rng.randrange(3, MODEL["vocab_size"]) for _ in range(args.prefix_len)]
    cold = time_to_first_token(engine, "cold", prefix + [11] * 16)
    warm = time_to_first_token(engine, "warm", prefix + [12] * 16)
    return {"prefix_len": args.prefix_len, "cold": cold, "warm": warm,
            "ratio_wall": warm["wall_s"] / cold["wall_s"], "ratio_cpu": warm["cpu_s"] / cold["cpu_s"],
            "target": "<= 0.10"}


def bench_caching_overhead(model_dir: str, args) -> dict:
    engines = {True: make_engine(model_dir, enable_prefix_caching=True),
               False: make_engine(model_dir, enable_prefix_caching=False)}
    rng = random.Random(2)
    runs: dict[bool, list[dict]] = {True: [], False: []}
    for rep in range(args.repeats):
        prompts, lengths = workload(rng, 32, (64, 256), (8, 32), MODEL["vocab_size"])  # fresh: 0% hits
        for on in (True, False) if rep % 2 == 0 else (False, True):
            run_engine(engines[on], [[5, 6, rep]], [1], tag=f"warm{rep}")
            r = run_engine(engines[on], prompts, lengths, tag=f"rep{rep}-")
            r["tok_per_s_cpu"] = (sum(map(len, prompts)) + r["output_tokens"]) / r["cpu_s"]
            r["tok_per_s_wall"] = (sum(map(len, prompts)) + r["output_tokens"]) / r["wall_s"]
            runs[on].append(r)
    assert engines[True].stats.prefix_cache_hits == 0
    med = {on: {k: statistics.median(r[k] for r in runs[on]) for k in ("tok_per_s_cpu", "tok_per_s_wall")}
           for on in runs}
    return {"caching_on": runs[True], "caching_off": runs[False], "median_on": med[True], "median_off": med[False],
            "ratio_cpu": med[True]["tok_per_s_cpu"] / med[False]["tok_per_s_cpu"],
            "ratio_wall": med[True]["tok_per_s_wall"] / med[False]["tok_per_s_wall"], "target": ">= 0.97"}


def make_model_dir(root: str) -> str:
    """One HF random init of MODEL, saved as safetensors: both engines load the same weights."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(MODEL)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(cfg.pop("model_type"), **cfg),
                                             dtype=torch.float32)
    model.save_pretrained(root)
    return root


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch

    torch.set_num_threads(args.threads)
    results: dict = {"settings": vars(args), "model": MODEL, "tiny_model": TINY, "cpu_count": os.cpu_count(),
                     "torch_threads": torch.get_num_threads(), "load_avg_start": os.getloadavg()}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_model_dir(tmp)
        for name, fn in (("throughput", bench_throughput), ("cached_ttft", bench_cached_ttft),
                         ("caching_overhead", bench_caching_overhead), ("step_overhead", None)):
            if name in args.skip:
                continue
            print(f"[engine bench] {name} ...", flush=True)
            results[name] = bench_step_overhead(args) if fn is None else fn(model_dir, args)
            print(json.dumps(summary(results, name)), flush=True)
    results["load_avg_end"] = os.getloadavg()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    plot(results, out.with_suffix(".png"))
    print(f"wrote {out}")
    return 0


def plot(results: dict, path: Path) -> None:
    """One panel per benchmark: measured (CPU-time based) vs its target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = []
    if "throughput" in results:
        t = results["throughput"]
        panels.append(("output tok/s (CPU time)", ["engine", f"HF static b={t['hf_batch_size']}"],
                       [t["engine"]["output_tok_per_s_cpu"], t["hf_static_batches"]["output_tok_per_s_cpu"]], None))
    if "cached_ttft" in results:
        t = results["cached_ttft"]
        panels.append((f"TTFT s, {t['prefix_len']}-token prefix", ["cold", "cached"],
                       [t["cold"]["cpu_s"], t["warm"]["cpu_s"]], t["cold"]["cpu_s"] * 0.10))
    if "caching_overhead" in results:
        t = results["caching_overhead"]
        panels.append(("tok/s at 0% hits", ["caching on", "caching off"],
                       [t["median_on"]["tok_per_s_cpu"], t["median_off"]["tok_per_s_cpu"]],
                       t["median_off"]["tok_per_s_cpu"] * 0.97))
    if "step_overhead" in results:
        ms = results["step_overhead"]["cpu_ms_per_step"]
        keys = ["schedule", "prepare_inputs", "sampler", "overhead"]
        panels.append((f"ms/step, {results['step_overhead']['running_seqs']} seqs", keys, [ms[k] for k in keys], 2.0))
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.5))
    for ax, (title, labels, values, target) in zip(list(getattr(axes, "flat", [axes])), panels, strict=True):
        ax.bar(labels, values, color="tab:blue")
        if target is not None:
            ax.axhline(target, color="tab:red", linestyle="--", label="target")
            ax.legend()
        ax.set_title(title, fontsize=9)
        ax.tick_params(axis="x", labelsize=7, rotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary(results: dict, name: str) -> dict:
    r = results[name]
    if name == "throughput":
        return {name: {"speedup_wall": r["speedup_wall"], "speedup_cpu": r["speedup_cpu"]}}
    if name == "step_overhead":
        return {name: r["cpu_ms_per_step"]}
    return {name: {"ratio_wall": r["ratio_wall"], "ratio_cpu": r["ratio_cpu"]}}


if __name__ == "__main__":
    raise SystemExit(main())
