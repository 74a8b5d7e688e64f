"""Scheduler: token budget, chunked prefill, running-first order, prefix hits, FCFS preemption."""

from __future__ import annotations

from kvmesh.replica.config import EngineConfig
from kvmesh.replica.engine.engine_request import EngineRequest
from kvmesh.replica.engine.llm_engine import LLMEngine
from kvmesh.replica.engine.request import RequestStatus
from kvmesh.replica.serving.sampling_params import SamplingParams
from kvmesh.replica.worker.fake_runner import FakeModelRunner

GREEDY = SamplingParams(temperature=0.0, max_tokens=4)


def make_engine(num_blocks=64, block_size=4, **kw) -> tuple[LLMEngine, FakeModelRunner]:
    runner = FakeModelRunner(num_kv_blocks=num_blocks, block_size=block_size, max_model_len=512)
    config = EngineConfig(model="fake", block_size=block_size, hash_seed=b"seed", debug_check_integrity=True, **kw)
    return LLMEngine(config, model_runner=runner, skip_tokenizer_init=True), runner


def schedule_once(engine: LLMEngine):
    return engine.scheduler.schedule()


def test_long_prompt_is_chunked_to_the_token_budget():
    engine, _ = make_engine(max_num_batched_tokens=16)
    engine.add_request(EngineRequest("a", list(range(1, 41)), GREEDY))
    chunks = []
    while True:
        out = engine.scheduler.schedule()
        sr = out.scheduled[0]
        chunks.append((sr.num_computed_tokens, len(sr.token_ids), sr.sample))
        if sr.sample:
            break
    assert chunks == [(0, 16, False), (16, 16, False), (32, 8, True)]


def test_running_requests_are_scheduled_before_waiting_ones():
    engine, _ = make_engine(max_num_batched_tokens=10)
    engine.add_request(EngineRequest("old", list(range(1, 9)), GREEDY))
    engine.step()  # "old" prefilled; now decoding
    engine.add_request(EngineRequest("new", list(range(20, 40)), GREEDY))
    out = schedule_once(engine)
    assert out.decode_request_ids == ["old"]  # its token is the runner's own last sample: sent by id
    assert [(s.request_id, len(s.token_ids)) for s in out.scheduled] == [("new", 9)]
    assert out.num_batched_tokens == 10


def test_decodes_are_sent_as_ids_with_only_the_blocks_they_gain():
    engine, _ = make_engine(block_size=4)
    engine.add_request(EngineRequest("a", [1, 2, 3, 4, 5, 6], SamplingParams(temperature=0.0, max_tokens=8)))
    first = schedule_once(engine)  # the prompt, in full
    assert [s.request_id for s in first.scheduled] == ["a"] and not first.decode_request_ids
    engine._process_sampled(engine.model_runner.execute_model(first))
    request = engine.scheduler.requests["a"]
    gained = {}
    for _ in range(3):  # positions 6, 7 (fills block 2), then 8: a new block
        out = schedule_once(engine)
        assert out.decode_request_ids == ["a"] and not out.scheduled
        gained.update(out.new_block_ids)
        engine._process_sampled(engine.model_runner.execute_model(out))
    assert gained == {"a": request.block_ids[2:]} and len(request.block_ids) == 3


def test_a_resumed_request_is_sent_in_full_again():
    engine, _ = make_engine(num_blocks=9, max_num_batched_tokens=64)
    engine.add_request(EngineRequest("old", [1] * 12, SamplingParams(temperature=0.0, max_tokens=16)))
    engine.add_request(EngineRequest("new", [2] * 12, SamplingParams(temperature=0.0, max_tokens=16)))
    resumed = []
    while engine.has_unfinished_requests():
        preempted = engine.scheduler.requests.get("new")
        was_preempted = preempted is not None and preempted.status == RequestStatus.PREEMPTED
        out = engine.scheduler.schedule()
        if was_preempted and preempted.status == RequestStatus.RUNNING:
            resumed.append(("new" in out.decode_request_ids, [s.request_id for s in out.scheduled]))
        sampled = engine.model_runner.execute_model(out)
        engine._process_sampled(sampled)
    assert resumed and all(not by_id and "new" in full for by_id, full in resumed)


def test_max_num_seqs_caps_the_running_batch():
    engine, _ = make_engine(max_num_seqs=2)
    for i in range(4):
        engine.add_request(EngineRequest(f"r{i}", [i + 1] * 5, GREEDY))
    out = schedule_once(engine)
    assert [s.request_id for s in out.scheduled] == ["r0", "r1"]
    assert engine.scheduler.num_waiting == 2


def test_prefix_cache_hit_advances_num_computed_tokens():
    engine, _ = make_engine()
    prompt = list(range(1, 18))  # 4 full blocks of 4 + 1
    engine.add_request(EngineRequest("first", prompt, GREEDY))
    while engine.has_unfinished_requests():
        engine.step()
    engine.add_request(EngineRequest("second", prompt[:16] + [99, 98], GREEDY))
    sr = schedule_once(engine).scheduled[0]
    assert sr.num_computed_tokens == 16 and sr.token_ids == [99, 98]
    assert engine.scheduler.requests["second"].num_cached_tokens == 16


def test_full_prompt_hit_still_computes_the_last_block():
    engine, _ = make_engine()
    prompt = list(range(1, 17))  # exactly 4 blocks
    engine.add_request(EngineRequest("first", prompt, GREEDY))
    while engine.has_unfinished_requests():
        engine.step()
    engine.add_request(EngineRequest("again", prompt, GREEDY))
    sr = schedule_once(engine).scheduled[0]
    # hits are whole blocks and capped below the last token, so the last block is recomputed (as vLLM)
    assert sr.num_computed_tokens == 12 and sr.token_ids == [13, 14, 15, 16] and sr.sample


def test_newest_running_request_is_preempted_when_blocks_run_out():
    engine, runner = make_engine(num_blocks=9, max_num_batched_tokens=64)  # 8 usable blocks of 4
    engine.add_request(EngineRequest("old", [1] * 12, SamplingParams(temperature=0.0, max_tokens=16)))
    engine.add_request(EngineRequest("new", [2] * 12, SamplingParams(temperature=0.0, max_tokens=16)))
    engine.step()  # both prefilled: 3 + 3 blocks (+1 each for their first sampled token later)
    old, new = engine.scheduler.requests["old"], engine.scheduler.requests["new"]
    seen = set()
    while engine.has_unfinished_requests():
        engine.step()
        seen.add((old.status, new.status))
    assert (RequestStatus.RUNNING, RequestStatus.PREEMPTED) in seen
    assert old.num_preemptions == 0 and new.num_preemptions >= 1
    assert engine.stats.num_preemptions >= 1
    assert engine.scheduler.num_preemptions == engine.stats.num_preemptions


def test_preempted_request_goes_back_to_the_front_of_the_queue():
    engine, _ = make_engine(num_blocks=9, max_num_batched_tokens=64, max_num_seqs=2)
    engine.add_request(EngineRequest("a", [1] * 12, SamplingParams(temperature=0.0, max_tokens=16)))
    engine.add_request(EngineRequest("b", [2] * 12, SamplingParams(temperature=0.0, max_tokens=16)))
    engine.add_request(EngineRequest("c", [3] * 4, SamplingParams(temperature=0.0, max_tokens=2)))
    while engine.scheduler.num_preemptions == 0:
        engine.step()
    assert [r.request_id for r in engine.scheduler.waiting] == ["b", "c"]


def test_cache_salt_isolates_prefixes():
    engine, _ = make_engine()
    prompt = list(range(1, 18))
    engine.add_request(EngineRequest("a", prompt, GREEDY, cache_salt="tenant-a"))
    while engine.has_unfinished_requests():
        engine.step()
    engine.add_request(EngineRequest("b", prompt, GREEDY, cache_salt="tenant-b"))
    assert schedule_once(engine).scheduled[0].num_computed_tokens == 0
    engine.add_request(EngineRequest("c", prompt, GREEDY, cache_salt="tenant-a"))
    scheduled = {s.request_id: s for s in schedule_once(engine).scheduled}
    assert scheduled["c"].num_computed_tokens == 16
