"""What logprobs cost the engine on CPU: ``python -m kvmesh.cluster.measure.benchmarks.logprobs``
(results/logprobs.json).

    sampler   one sampling step of a [N, vocab] batch with logprobs None / 0 / 5 / 20 (low-noise view)
    decode    a batch of requests generating tokens with logprobs None / 0 / 5 / 20 per token
              (log_softmax over the vocabulary + top-k + building the per-token entries)
    scoring   lm-eval's loglikelihood shape: prompts, max_tokens=1, without vs with prompt logprobs
              (every prompt position's logits + log_softmax; such requests also skip prefix-cache reads)

Variants run interleaved, ``--repeats`` times each, on the engine benchmark's dummy Llama (vocab 32,000);
reported: median process CPU time and wall time per generated token (decode) or per prompt token (scoring).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
from pathlib import Path

from kvmesh.cluster.measure.benchmarks.engine import MODEL, WallCpuClock
from kvmesh.cluster.measure.benchmarks.support.engines import make_engine
from kvmesh.replica.engine.engine_request import EngineRequest

DECODE_VARIANTS = {"none": None, "logprobs=0": 0, "logprobs=5": 5, "logprobs=20": 20}
SCORING_VARIANTS = {"none": None, "prompt_logprobs=1": 1}


def parse_args(argv):
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m kvmesh.cluster.measure.benchmarks.logprobs",
                                description=__doc__.split("\n")[0])
    p.add_argument("--out", default="results/logprobs.json")
    p.add_argument("--num-requests", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=64, help="decode workload's prompt length")
    p.add_argument("--output-len", type=int, default=32, help="decode workload's tokens per request")
    p.add_argument("--scoring-len", type=int, default=256, help="scoring workload's prompt length")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    return p.parse_args(argv)


def run(engine, prompts, params, tag: str) -> dict[str, float]:
    clock = WallCpuClock()
    for i, prompt in enumerate(prompts):
        engine.add_request(EngineRequest(f"{tag}-{i}", prompt, params))
    while engine.has_unfinished_requests():
        engine.step()
    return clock.read()


def median_per(times: list[dict[str, float]], units: int) -> dict[str, float]:
    return {f"{k}_per_token_ms": 1e3 * statistics.median(t[k] for t in times) / units for k in ("cpu_s", "wall_s")}


def sampler_step_ms(num_rows: int, vocab: int, steps: int = 50) -> dict[str, float]:
    """CPU ms of ``Sampler.sample_with_logprobs`` (+ building the per-row entries) per step, per variant."""
    import time

    import torch
    from kvmesh.replica.sample.sampler import Sampler, build_sampling_metadata
    from kvmesh.replica.serving.sampling_params import SamplingParams

    logits = torch.randn(num_rows, vocab, generator=torch.Generator().manual_seed(0))
    sampler = Sampler()
    out = {}
    for name, k in DECODE_VARIANTS.items():
        params = [SamplingParams(temperature=0.0, logprobs=k)] * num_rows
        md = build_sampling_metadata(params, [0] * num_rows, vocab, [], torch.device("cpu"))
        start = time.process_time()
        for _ in range(steps):
            _, lp = sampler.sample_with_logprobs(logits, md)
            if lp is not None:
                [lp.row(i, k) for i in range(num_rows)]
        out[name] = 1e3 * (time.process_time() - start) / steps
    return out


def main(argv=None) -> dict:
    import torch
    from kvmesh.replica.serving.sampling_params import SamplingParams

    args = parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))  # the engine keeps it (model_runner)
    torch.set_num_threads(args.threads)
    rng = random.Random(0)
    engine = make_engine(None, MODEL, enable_prefix_caching=False, max_num_seqs=args.num_requests)

    def prompts(length: int) -> list[list[int]]:
        return [[rng.randrange(1, MODEL["vocab_size"]) for _ in range(length)] for _ in range(args.num_requests)]

    sampler = sampler_step_ms(args.num_requests, MODEL["vocab_size"])
    print(f"sampler step CPU ms ({args.num_requests} rows): {sampler}", flush=True)
    decode: dict[str, list] = {name: [] for name in DECODE_VARIANTS}
    scoring: dict[str, list] = {name: [] for name in SCORING_VARIANTS}
    run(engine, prompts(args.prompt_len), SamplingParams(temperature=0.0, max_tokens=4), "warmup")
    for r in range(args.repeats):
        for name, k in DECODE_VARIANTS.items():
            params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True, logprobs=k)
            decode[name].append(run(engine, prompts(args.prompt_len), params, f"d{r}{name}"))
            print(f"decode {name} repeat {r}: {decode[name][-1]}", flush=True)
        for name, k in SCORING_VARIANTS.items():
            params = SamplingParams(temperature=0.0, max_tokens=1, logprobs=1, prompt_logprobs=k)
            scoring[name].append(run(engine, prompts(args.scoring_len), params, f"s{r}{name}"))
            print(f"scoring {name} repeat {r}: {scoring[name][-1]}", flush=True)
    # decode times include the prefill of the prompts, the same in every variant
    results = {
        "args": vars(args), "model": MODEL, "torch_threads": torch.get_num_threads(),
        "load_avg_end": os.getloadavg(), "sampler_step_cpu_ms": sampler,
        "decode": {n: median_per(t, args.num_requests * args.output_len) for n, t in decode.items()},
        "scoring": {n: median_per(t, args.num_requests * args.scoring_len) for n, t in scoring.items()},
        "raw": {"decode": decode, "scoring": scoring},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(json.dumps({k: results[k] for k in ("sampler_step_cpu_ms", "decode", "scoring")}, indent=2))
    return results


if __name__ == "__main__":
    main()
