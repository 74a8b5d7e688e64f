"""What penalties cost a sampling step: ``python -m kvmesh.cluster.measure.benchmarks.penalties``
(results/penalties.json).

One step = the input batch's sampling metadata (penalized rows: their device counts and prompt masks gathered),
the eager sampler on [N, vocab] logits, and counting the sampled tokens into the rows' device counts -- greedy
rows without penalties against the same rows with repetition, frequency and presence penalties (prompts of
``--prompt-len`` tokens, ``--output-len`` tokens already generated), at each batch size. Reported: median
wall ms per step over ``--repeats`` rounds of ``--steps`` steps (synchronized on a GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

VARIANTS = ("none", "penalties")


def parse_args(argv):
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m kvmesh.cluster.measure.benchmarks.penalties",
                                description=__doc__.split("\n")[0])
    p.add_argument("--out", default="results/penalties.json")
    p.add_argument("--batch-sizes", default="1,32,256")
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    return p.parse_args(argv)


def make_batch(variant: str, num_rows: int, args, device):
    import numpy as np
    from kvmesh.replica.serving.sampling_params import SamplingParams
    from kvmesh.replica.step.scheduler_output import ScheduledRequest, SchedulerOutput
    from kvmesh.replica.worker.input_batch import InputBatch

    rng = np.random.default_rng(0)
    extra = {} if variant == "none" else {"repetition_penalty": 1.2, "frequency_penalty": 0.5, "presence_penalty": 0.5}
    sp = SamplingParams(temperature=0.0, max_tokens=1 << 20, **extra)
    batch = InputBatch(num_rows, 1, 16, device)
    srs = [ScheduledRequest(f"r{i}", [1], 3, [1], True, sp, rng.integers(0, args.vocab, args.output_len).tolist(),
                            None, rng.integers(0, args.vocab, args.prompt_len).tolist()) for i in range(num_rows)]
    return batch, batch.prepare(SchedulerOutput(srs, num_rows)).sample_rows


def step_ms(variant: str, num_rows: int, args, device) -> float:
    import torch
    from kvmesh.replica.sample.sampler import Sampler

    batch, rows = make_batch(variant, num_rows, args, device)
    logits = torch.randn(num_rows, args.vocab, device=device)
    sampler = Sampler()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(2):  # warm-up: the first step fills the penalized rows from their tokens
        batch.count_samples(rows, sampler(logits, batch.sampling_metadata(rows, args.vocab, [])))
    sync()
    start = time.perf_counter()
    for _ in range(args.steps):
        batch.count_samples(rows, sampler(logits, batch.sampling_metadata(rows, args.vocab, [])))
    sync()
    return 1e3 * (time.perf_counter() - start) / args.steps


def main(argv=None) -> dict:
    import torch

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    raw = {f"{v}@{n}": [] for n in sizes for v in VARIANTS}
    for r in range(args.repeats):
        for n in sizes:
            for v in VARIANTS:  # interleaved, so drift hits both alike
                raw[f"{v}@{n}"].append(step_ms(v, n, args, device))
                print(f"repeat {r} batch {n} {v}: {raw[f'{v}@{n}'][-1]:.3f} ms", flush=True)
    table = {n: {v: statistics.median(raw[f"{v}@{n}"]) for v in VARIANTS} for n in sizes}
    for row in table.values():
        row["added_ms"] = row["penalties"] - row["none"]
    results = {"args": vars(args), "device": str(device), "torch_threads": torch.get_num_threads(),
               "load_avg_end": os.getloadavg(), "step_ms": table, "raw": raw}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(json.dumps(table, indent=2))
    return results


if __name__ == "__main__":
    main()
