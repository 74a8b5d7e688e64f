"""Time to first token of a long prompt, cold and with its prefix in the prefix cache.

Per repeat: a fresh random prefix P; ``P + 16 new tokens`` cold, then ``P + 16 other tokens``,
whose first len(P) tokens (whole blocks) the engine reports as cached. Medians over the repeats.
"""

from __future__ import annotations

import random
import statistics

from kvmesh.cluster.measure.benchmarks.engine_speed.timing import Clock
from kvmesh.cluster.measure.benchmarks.engine_speed.workload import greedy, random_tokens
from kvmesh.replica.engine.engine_request import EngineRequest

NEW_TOKENS = 16


def first_token(engine, request_id: str, prompt: list[int], device) -> dict:
    """ms from add_request to the first sampled token, and the prompt tokens the engine found cached."""
    clock = Clock(device)
    engine.add_request(EngineRequest(request_id, prompt, greedy(1)))
    cached = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.request_id == request_id and out.new_token_ids and cached is None:
                t = clock.read()
                cached = out.num_cached_tokens
    return {"wall_ms": 1000 * t["wall_s"], "cpu_ms": 1000 * t["cpu_s"], "num_cached_tokens": cached}


def ttft(engine, prefix_len: int, repeats: int, seed: int, device) -> dict:
    rng = random.Random(f"ttft-{seed}")  # no prefix shared with other phases
    runs = []
    for r in range(repeats):
        prefix = random_tokens(rng, prefix_len, engine.vocab_size)
        cold = first_token(engine, f"ttft{r}-cold", prefix + random_tokens(rng, NEW_TOKENS, engine.vocab_size), device)
        cached = first_token(engine, f"ttft{r}-cached", prefix + random_tokens(rng, NEW_TOKENS, engine.vocab_size),
                             device)
        runs.append({"cold": cold, "cached": cached})
    summary = {kind: {key: statistics.median(run[kind][key] for run in runs)
                      for key in ("wall_ms", "cpu_ms", "num_cached_tokens")} for kind in ("cold", "cached")}
    return {"prefix_len": prefix_len, "new_tokens": NEW_TOKENS, **summary, "repeats": runs}
