"""The "priority" scheduling policy (vLLM's): waiting requests run by (priority, arrival), the running request
with the largest (priority, arrival) is preempted first, greedy tokens do not depend on the mix; "fcfs"
refuses a non-zero priority."""

from __future__ import annotations

import random

import pytest
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.engine.engine_request import EngineRequest
from kvmesh.replica.engine.llm_engine import LLMEngine
from kvmesh.replica.engine.request import RequestStatus
from kvmesh.replica.engine.request_queue import PriorityRequestQueue
from kvmesh.replica.serving.sampling_params import SamplingParams
from kvmesh.replica.worker.fake_runner import FakeModelRunner


def make_engine(num_blocks=64, block_size=4, **kw) -> LLMEngine:
    runner = FakeModelRunner(num_kv_blocks=num_blocks, block_size=block_size, max_model_len=512)
    config = EngineConfig(model="fake", block_size=block_size, hash_seed=b"seed", debug_check_integrity=True, **kw)
    return LLMEngine(config, model_runner=runner, skip_tokenizer_init=True)


def params(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def test_waiting_requests_run_by_priority_then_arrival():
    engine = make_engine(scheduling_policy="priority", max_num_seqs=1)
    for rid, priority in [("low", 5), ("high-1", -1), ("mid", 0), ("high-2", -1), ("mid-2", 0)]:
        engine.add_request(EngineRequest(rid, [1, 2, 3], params(1), priority=priority))
    assert [r.request_id for r in engine.scheduler.waiting] == ["high-1", "high-2", "mid", "mid-2", "low"]
    order = []
    while engine.has_unfinished_requests():
        order += [out.request_id for out in engine.step() if out.finished]
    assert order == ["high-1", "high-2", "mid", "mid-2", "low"]


def test_fcfs_keeps_arrival_order():
    engine = make_engine(max_num_seqs=1)
    for rid in ["a", "b", "c"]:
        engine.add_request(EngineRequest(rid, [1, 2, 3], params(1)))
    order = []
    while engine.has_unfinished_requests():
        order += [out.request_id for out in engine.step() if out.finished]
    assert order == ["a", "b", "c"]


def test_the_lowest_priority_is_preempted_first_not_the_newest():
    # 8 usable blocks of 4; three 8-token prompts take 2 blocks each and grow: the room runs out
    engine = make_engine(num_blocks=9, max_num_batched_tokens=64, scheduling_policy="priority")
    engine.add_request(EngineRequest("old-low", [1] * 8, params(16), priority=1))
    engine.step()  # running first; the others arrive later
    engine.add_request(EngineRequest("mid", [2] * 8, params(16), priority=0))
    engine.add_request(EngineRequest("new-high", [3] * 8, params(16), priority=-1))
    requests = dict(engine.scheduler.requests)
    while engine.scheduler.num_preemptions == 0:
        engine.step()
    assert requests["old-low"].status == RequestStatus.PREEMPTED
    assert requests["mid"].num_preemptions == requests["new-high"].num_preemptions == 0
    assert [r.request_id for r in engine.scheduler.running] == ["new-high", "mid"]  # (priority, arrival) order
    while engine.has_unfinished_requests():
        engine.step()
    assert requests["new-high"].num_preemptions == 0


def test_a_preempted_request_waits_behind_higher_priorities_and_before_lower_ones():
    engine = make_engine(num_blocks=9, max_num_batched_tokens=64, max_num_seqs=2, scheduling_policy="priority")
    engine.add_request(EngineRequest("a", [1] * 12, params(16), priority=0))
    engine.add_request(EngineRequest("b", [2] * 12, params(16), priority=0))
    while engine.scheduler.num_preemptions == 0:
        engine.step()
        if engine.scheduler.num_running == 2 and "late" not in engine.scheduler.requests:
            engine.add_request(EngineRequest("late", [3] * 4, params(2), priority=1))
            engine.add_request(EngineRequest("urgent", [4] * 4, params(2), priority=-1))
    assert [r.request_id for r in engine.scheduler.waiting] == ["urgent", "b", "late"]


def test_priority_queue_removes_and_prepends():
    engine = make_engine(scheduling_policy="priority")
    for rid, priority in [("x", 2), ("y", 1), ("z", 3)]:
        engine.add_request(EngineRequest(rid, [1, 2], params(1), priority=priority))
    queue = engine.scheduler.waiting
    assert isinstance(queue, PriorityRequestQueue)
    engine.abort_request("y")
    assert [r.request_id for r in queue] == ["x", "z"] and len(queue) == 2
    x = queue.pop_request()
    queue.prepend_request(x)
    assert queue.peek_request() is x and x in queue


def test_fcfs_refuses_a_nonzero_priority():
    engine = make_engine()
    with pytest.raises(ValueError, match="priority scheduling is not enabled"):
        engine.add_request(EngineRequest("a", [1, 2], params(1), priority=1))
    assert not engine.has_unfinished_requests()
    engine.add_request(EngineRequest("b", [1, 2], params(1), priority=0))
    with pytest.raises(ValueError, match="integer"):
        make_engine(scheduling_policy="priority").add_request(EngineRequest("c", [1, 2], params(1), priority=1.5))
    with pytest.raises(ValueError, match="scheduling_policy"):
        EngineConfig(model="fake", scheduling_policy="lifo")


@pytest.mark.parametrize("seed", [1, 2])
def test_greedy_tokens_do_not_depend_on_the_priority_mix(stories_path, seed):
    """Mixed priorities on a KV cache small enough to preempt give each request the tokens of a roomy fcfs run."""
    rng = random.Random(seed)
    requests = {f"r{i}": ([rng.randrange(3, 512) for _ in range(rng.randrange(5, 30))], rng.randrange(8, 24),
                          rng.choice([-1, 0, 0, 2])) for i in range(6)}

    def run(**kw) -> tuple[dict[str, list[int]], LLMEngine]:
        engine = LLMEngine(EngineConfig(model=str(stories_path), dtype="float32", device="cpu", block_size=4,
                                        hash_seed=b"s", kv_cache_memory=1 << 22, **kw), skip_tokenizer_init=True)
        for rid, (prompt, n, priority) in requests.items():
            engine.add_request(EngineRequest(rid, prompt, params(n), priority=priority if kw else 0))
        finals = {}
        while engine.has_unfinished_requests():
            finals |= {out.request_id: out.output_token_ids for out in engine.step() if out.finished}
        return finals, engine

    tight, engine = run(scheduling_policy="priority", num_kv_blocks=24, max_num_batched_tokens=32)
    assert engine.stats.num_preemptions > 0
    roomy, _ = run()
    assert tight == roomy
