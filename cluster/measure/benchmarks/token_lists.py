"""What long token lists cost the engine thread on CPU: ``python -m kvmesh.cluster.measure.benchmarks.token_lists``
(results/token_lists.json).

    step      the sampling settings of one step of ``--rows`` decoding rows, each with a logit_bias (or an
              allowed_token_ids) of ``--entries`` token ids, over a vocabulary of ``--vocab``: the rows joining
              the batch (their step's inputs), the first step after, and the median of the steps after it
              (rows unchanged)
    n         one request with n = ``--rows`` and both lists: its children made (plan_candidates) and each one
              checked as the engine checks the requests it is handed (validate_request_input)

Median of ``--repeats`` runs; process CPU time and wall time in ms.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch
from kvmesh.replica.engine.engine_request import EngineRequest
from kvmesh.replica.engine.request_checks import validate_request_input
from kvmesh.replica.server.parallel_sampling import plan_candidates
from kvmesh.replica.serving.sampling_params import SamplingParams
from kvmesh.replica.step.scheduler_output import ScheduledRequest, SchedulerOutput
from kvmesh.replica.worker.input_batch import InputBatch


def parse_args(argv):
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m kvmesh.cluster.measure.benchmarks.token_lists",
                                description=__doc__.split("\n")[0])
    p.add_argument("--out", default="results/token_lists.json")
    p.add_argument("--rows", type=int, default=128, help="decoding rows of a step, and the request's n")
    p.add_argument("--vocab", type=int, default=150_000)
    p.add_argument("--entries", type=int, default=150_000, help="token ids in each row's list")
    p.add_argument("--steps", type=int, default=5, help="steps after the first, per run")
    p.add_argument("--repeats", type=int, default=3)
    return p.parse_args(argv)


def timed(fn) -> dict[str, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return {"wall_ms": 1e3 * (time.perf_counter() - wall), "cpu_ms": 1e3 * (time.process_time() - cpu)}


def median(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: round(statistics.median(r[k] for r in runs), 2) for k in runs[0]}


def step_ms(args, kind: str) -> dict[str, dict[str, float]]:
    """First and later steps' ``sampling_metadata`` of ``args.rows`` rows that share one list of ``kind``."""
    ids = np.random.default_rng(0).choice(args.vocab, args.entries, replace=False).tolist()
    sp = SamplingParams(temperature=1.0, **({"logit_bias": dict.fromkeys(ids, 1.5)} if kind == "logit_bias"
                                            else {"allowed_token_ids": ids}))
    join, first, later = [], [], []
    for _ in range(args.repeats):
        batch = InputBatch(args.rows, 1, 16, torch.device("cpu"))
        srs = [ScheduledRequest(f"r{i}", [1], 3, [1], True, sp) for i in range(args.rows)]
        join.append(timed(partial(batch.prepare, SchedulerOutput(srs, len(srs)))))
        decode = SchedulerOutput([], len(srs), decode_request_ids=[sr.request_id for sr in srs])
        step = partial(batch.sampling_metadata, batch.prepare(decode).sample_rows, args.vocab, [2])
        first.append(timed(step))
        later += [timed(step) for _ in range(args.steps)]
    return {"join": median(join), "first_step": median(first), "later_step": median(later)}


def n_request_ms(args) -> dict[str, float]:
    """One request of n = ``args.rows`` with both lists: children made and each checked by the engine."""
    ids = list(range(min(args.entries, args.vocab)))
    base = SamplingParams(temperature=1.0, seed=1, logit_bias=dict.fromkeys(ids, 0.5), allowed_token_ids=ids)

    def make_and_check() -> None:
        for c in plan_candidates(EngineRequest("req", [1, 2, 3], base), [[1, 2, 3]], [base], args.rows, None, False):
            validate_request_input(c.request.prompt_token_ids, c.request.sampling_params, max_model_len=64,
                                   vocab_size=args.vocab, block_size=16, num_usable_blocks=64, has_tokenizer=False)

    return median([timed(make_and_check) for _ in range(args.repeats)])


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(1)
    result = {"config": vars(args), "logit_bias": step_ms(args, "logit_bias"),
              "allowed_token_ids": step_ms(args, "allowed_token_ids"), "n_request": n_request_ms(args)}
    print(json.dumps(result, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
