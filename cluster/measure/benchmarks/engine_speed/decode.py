"""Decode-step time at N running sequences: N prompts of the same length prefilled, then steady steps timed.

Every sequence has prefilled (produced a token) before the warm-up steps start, so each timed step
is decode only: N rows, one token each, context ``context + a few``. ``engine.step()`` ends in one
device-to-host copy of the sampled tokens; the Clock syncs the device around each step as well.
"""

from __future__ import annotations

import random
import statistics

from kvmesh.cluster.measure.benchmarks.engine_speed.timing import Clock
from kvmesh.cluster.measure.benchmarks.engine_speed.workload import greedy, random_tokens
from kvmesh.replica.engine.engine_request import EngineRequest


def decode_step_times(engine, batch: int, context: int, warmup: int, steps: int, budget: int,
                      seed: int, device) -> dict:
    """ms per decode step with ``batch`` running sequences of ``context``-token prompts."""
    rng = random.Random(f"decode-{batch}-{seed}")  # no prefix shared with other phases
    prefill_steps = -(-batch * context // budget) + 1
    max_tokens = prefill_steps + warmup + steps + 8  # nobody finishes before the last timed step
    ids = [f"d{batch}-{i}" for i in range(batch)]
    for rid in ids:
        engine.add_request(EngineRequest(rid, random_tokens(rng, context, engine.vocab_size), greedy(max_tokens)))
    started: set[str] = set()
    while len(started) < batch:
        started.update(o.request_id for o in engine.step() if o.new_token_ids)
    if engine.scheduler.num_running != batch:
        raise RuntimeError(f"{engine.scheduler.num_running} sequences running, wanted {batch}: "
                           "the KV cache or max_num_seqs is too small for this batch")
    for _ in range(warmup):
        engine.step()
    wall, cpu = [], []
    for _ in range(steps):
        clock = Clock(device)
        outputs = engine.step()
        t = clock.read()
        if len(outputs) != batch:
            raise RuntimeError(f"a timed decode step produced {len(outputs)} outputs for {batch} sequences")
        wall.append(1000 * t["wall_s"])
        cpu.append(1000 * t["cpu_s"])
    engine.abort_request(ids)
    engine.step()  # collect the aborts; frees the blocks
    return {"running_seqs": batch, "context_tokens": context, "steps": steps,
            "wall_ms_per_step": statistics.median(wall), "wall_ms_mean": statistics.fmean(wall),
            "cpu_ms_per_step": statistics.median(cpu)}
