"""The persistent batch on a real model: the rows the runner keeps between steps mirror the
scheduler's requests through decodes by id, new blocks and preemption (rows re-sent in full), and
greedy and seeded tokens equal each request run alone."""

from __future__ import annotations

import random

import numpy as np
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.engine.engine_request import EngineRequest
from kvmesh.replica.engine.llm_engine import LLMEngine
from kvmesh.replica.serving.sampling_params import SamplingParams


def engine(stories_path, **kw) -> LLMEngine:
    # on the CPU on every machine: tokens must equal runs alone bit for bit, across batch shapes, which
    # CUDA's shape-dependent kernels do not promise (near ties may break the other way)
    config = EngineConfig(model=str(stories_path), dtype="float32", device="cpu", block_size=4, hash_seed=b"s",
                          kv_cache_memory=1 << 22, **kw)
    return LLMEngine(config, skip_tokenizer_init=True)


def check_rows_mirror_requests(e: LLMEngine) -> int:
    """Every request that will decode by id has a row equal to its state; returns how many were checked."""
    batch = e.model_runner.input_batch
    checked = 0
    for request in e.scheduler.running:
        if not request.decoding_in_runner:
            continue
        row = batch.block_tables.rows[request.request_id]
        assert batch.num_computed[row] == request.num_computed_tokens, request
        assert batch.last_token[row] == request.output_token_ids[-1], request
        assert batch.num_output[row] == len(request.output_token_ids), request  # seeded generators use it
        table = batch.block_tables.table[row, : batch.block_tables.num_blocks[row]]
        np.testing.assert_array_equal(table, request.block_ids)
        checked += 1
    return checked


def test_rows_mirror_the_requests_and_greedy_tokens_match_runs_alone(stories_path):
    rng = random.Random(0)
    requests = {f"r{i}": ([rng.randrange(3, 512) for _ in range(rng.randrange(5, 40))], rng.randrange(5, 30))
                for i in range(7)}
    seeded = SamplingParams(temperature=0.9, top_p=0.95, seed=7, max_tokens=24, ignore_eos=True)
    busy = engine(stories_path, num_kv_blocks=30, max_num_batched_tokens=32)  # 29 blocks of 4: preemption
    for rid, (prompt, n) in requests.items():
        busy.add_request(EngineRequest(rid, prompt, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)))
    busy.add_request(EngineRequest("seeded", [1, 403, 407, 261, 378], seeded))
    finals, checked = {}, 0
    while busy.has_unfinished_requests():
        for out in busy.step():
            if out.finished:
                finals[out.request_id] = out.output_token_ids
        checked += check_rows_mirror_requests(busy)
    assert busy.stats.num_preemptions > 0 and checked > 100
    alone = engine(stories_path)
    alone.add_request(EngineRequest("seeded", [1, 403, 407, 261, 378], seeded))
    while alone.has_unfinished_requests():
        for out in alone.step():
            if out.finished:  # a seeded row's draws depend on its own seed and position only
                assert out.output_token_ids == finals["seeded"]
    for rid, (prompt, n) in requests.items():
        alone = engine(stories_path)
        alone.add_request(EngineRequest(rid, prompt, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)))
        while alone.has_unfinished_requests():
            for out in alone.step():
                if out.finished:
                    assert out.output_token_ids == finals[rid], rid
