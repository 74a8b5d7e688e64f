"""What a replica reports as running and waiting (``/load`` and its published load): a request no step has tried
yet counts as its next step will find it. A router reads waiting requests beside running ones as every slot taken
(router/admission/room.py): on a busy host a request caught between its arrival and the next step, reported waiting
beside one running, taught admission that the replica runs one request at a time, and eight clients were served one
by one."""

from __future__ import annotations

from kvmesh.replica.config import EngineConfig
from kvmesh.replica.engine.engine_request import EngineRequest
from kvmesh.replica.engine.llm_engine import LLMEngine
from kvmesh.replica.engine.load_fields import load_report
from kvmesh.replica.serving.sampling_params import SamplingParams
from kvmesh.replica.worker.fake_runner import FakeModelRunner

LONG = SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True)


def _engine(max_num_seqs: int, num_blocks: int = 64) -> LLMEngine:
    runner = FakeModelRunner(num_kv_blocks=num_blocks, block_size=4, max_model_len=512)
    config = EngineConfig(model="fake", block_size=4, hash_seed=b"seed", max_num_seqs=max_num_seqs)
    return LLMEngine(config, model_runner=runner, skip_tokenizer_init=True)


def _counts(engine: LLMEngine) -> tuple[int, int]:
    report = load_report(engine)
    return report.num_requests_running, report.num_requests_waiting


def test_a_request_added_since_the_last_step_counts_as_running_where_a_slot_is_free():
    engine = _engine(max_num_seqs=4)
    engine.add_request(EngineRequest("a", list(range(1, 9)), LONG))
    engine.step()
    engine.add_request(EngineRequest("b", list(range(20, 28)), LONG))  # in the scheduler's queue, not tried yet
    assert _counts(engine) == (2, 0)
    engine.step()
    assert _counts(engine) == (2, 0)  # the step started it, as reported


def test_requests_a_step_left_waiting_and_those_behind_them_count_as_waiting():
    engine = _engine(max_num_seqs=1)
    engine.add_request(EngineRequest("a", list(range(1, 9)), LONG))
    engine.add_request(EngineRequest("b", list(range(20, 28)), LONG))
    engine.step()
    assert _counts(engine) == (1, 1)  # no slot for it: every slot taken, as a router should learn
    engine.add_request(EngineRequest("c", list(range(40, 48)), LONG))
    assert _counts(engine) == (1, 2)  # behind a waiting request: it waits too


def test_requests_past_the_free_slots_count_as_waiting():
    engine = _engine(max_num_seqs=2)
    engine.add_request(EngineRequest("a", list(range(1, 9)), LONG))
    engine.step()
    for i in range(3):
        engine.add_request(EngineRequest(f"n{i}", list(range(20 + 10 * i, 28 + 10 * i)), LONG))
    assert _counts(engine) == (2, 2)
    engine.step()
    assert _counts(engine) == (2, 2)
