"""Engine step overhead: CPU time per decode step outside the model forward, split by part
(``kvmesh bench engine``'s ``step_overhead``; ``engine_ab`` runs it on two checkouts)."""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from kvmesh.replica.engine.engine_request import EngineRequest

P = ParamSpec("P")
R = TypeVar("R")

TINY = dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, vocab_size=1000, max_position_embeddings=4096)


def _timed(fn: Callable[P, R], bucket: list[float]) -> Callable[P, R]:
    """``fn``, adding each call's thread CPU seconds to ``bucket``."""
    def wrapper(*a: P.args, **kw: P.kwargs) -> R:
        t = time.thread_time()
        try:
            return fn(*a, **kw)
        finally:
            bucket.append(time.thread_time() - t)
    return wrapper


def bench_step_overhead(args: argparse.Namespace) -> dict:
    """Decode steps of ``overhead_seqs`` running sequences on a tiny model; CPU time per step by part."""
    from kvmesh.cluster.measure.benchmarks.support.engines import make_engine

    n = args.overhead_seqs
    engine = make_engine(None, TINY, max_num_seqs=n, max_num_batched_tokens=max(2048, 16 * n), kv_cache_memory=1 << 28)
    runner = engine.model_runner
    parts: dict[str, list[float]] = {k: [] for k in ("forward", "logits", "schedule", "prepare_inputs", "attn_metadata",
                                                      "sampling_metadata", "sampler", "process_outputs")}
    runner.model.forward = _timed(runner.model.forward, parts["forward"])
    runner.model.compute_logits = _timed(runner.model.compute_logits, parts["logits"])
    runner.sampler = _timed(runner.sampler, parts["sampler"])
    runner.attn_backend.build = _timed(runner.attn_backend.build, parts["attn_metadata"])
    runner.input_batch.prepare = _timed(runner.input_batch.prepare, parts["prepare_inputs"])
    runner.input_batch.sampling_metadata = _timed(runner.input_batch.sampling_metadata, parts["sampling_metadata"])
    engine.scheduler.schedule = _timed(engine.scheduler.schedule, parts["schedule"])
    engine._process_sampled = _timed(engine._process_sampled, parts["process_outputs"])
    from kvmesh.replica.serving.sampling_params import SamplingParams

    rng = random.Random(3)
    for i in range(n):
        engine.add_request(EngineRequest(f"o{i}", [rng.randrange(3, 1000) for _ in range(16)],
                           SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)))
    for _ in range(5):  # prefill, then settle into decode
        engine.step()
    assert engine.scheduler.num_running == n
    for v in parts.values():
        v.clear()
    steps, total, wall = 40, [], []
    for _ in range(steps):
        t, w = time.thread_time(), time.perf_counter()
        engine.step()
        total.append(time.thread_time() - t)
        wall.append(time.perf_counter() - w)
    ms = {k: 1000 * sum(v) / steps for k, v in parts.items()}
    ms["step"] = 1000 * sum(total) / steps
    ms["step_wall"] = 1000 * sum(wall) / steps  # wall clock of the whole step (parts are CPU time)
    ms["overhead"] = ms["step"] - ms["forward"] - ms["logits"]
    ms["overhead_excl_sampler_kernel"] = ms["overhead"] - ms["sampler"]
    ms["python_calibration"] = python_calibration_ms()
    return {"running_seqs": n, "steps": steps, "cpu_ms_per_step": ms, "target": "overhead <= 2 ms"}


def python_calibration_ms() -> float:
    """CPU ms of a fixed pure-Python loop (256 small objects x 100), to judge how fast this machine ran."""
    class Row:
        __slots__ = ("a", "b")

        def __init__(self, a, b):
            self.a, self.b = a, b

    t = time.thread_time()
    for _ in range(100):
        rows = [Row(i, [i]) for i in range(256)]
        sum(r.a for r in rows)
    return 1000 * (time.thread_time() - t)
