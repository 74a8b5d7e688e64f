"""A request's ``remote_kv`` in the scheduler (fake runner, no transfer): while the peer is asked what it holds the
request keeps its place and the others run; a refused or failed pull ends the wait and the prompt is computed; the
pull's outcome rides on the request's outputs; the prefill side's lease leaves on its final output."""

from __future__ import annotations

import concurrent.futures

from kvmesh.replica.config import EngineConfig
from kvmesh.replica.engine.engine_request import EngineRequest
from kvmesh.replica.engine.llm_engine import LLMEngine
from kvmesh.replica.engine.remote_kv import PullResult, RemoteKV
from kvmesh.replica.engine.request import RequestStatus
from kvmesh.replica.serving.sampling_params import SamplingParams
from kvmesh.replica.worker.fake_runner import FakeModelRunner

PROMPT = list(range(1, 19))  # 4 full blocks of 4 and 2 tokens
THREE = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)


def _engine() -> LLMEngine:
    return LLMEngine(EngineConfig(model="fake", block_size=4, hash_seed=b"s", debug_check_integrity=True),
                     model_runner=FakeModelRunner(num_kv_blocks=64, block_size=4), skip_tokenizer_init=True)


class _Peer:
    """A ``RemoteSource`` whose answer the test gives (``answer``); records how the pull ended."""

    def __init__(self) -> None:
        self.found: concurrent.futures.Future = concurrent.futures.Future()
        self.lookups, self.results = 0, []

    def lookup(self) -> concurrent.futures.Future:
        self.lookups += 1
        return self.found

    def done(self, result: PullResult, error: BaseException | None = None) -> None:
        self.results.append(result)

    async def ended(self) -> None:
        return None


def _finals(engine: LLMEngine, steps: int) -> dict:
    finals = {}
    for _ in range(steps):
        finals.update({o.request_id: o for o in engine.step() if o.finished})
    return finals


def test_a_request_keeps_its_place_while_the_peer_is_asked_and_computes_the_prompt_when_refused():
    engine, peer = _engine(), _Peer()
    engine.add_request(EngineRequest("pd", PROMPT, THREE, remote_kv=RemoteKV(remote=peer)))
    engine.add_request(EngineRequest("other", [7, 8, 9], THREE))
    finals = _finals(engine, 5)
    assert set(finals) == {"other"}  # the other request ran start to finish meanwhile
    assert engine.scheduler.requests["pd"].status == RequestStatus.WAITING and peer.lookups == 1
    assert engine.waits_only_for_remote_kvs  # the engine thread may sleep until the answer wakes it
    peer.found.set_result(PullResult("skipped"))  # the holder has none of it
    finals = _finals(engine, 5)
    assert finals["pd"].kv_pull == PullResult("skipped") and len(finals["pd"].output_token_ids) == 3
    assert peer.results == [PullResult("skipped")] and not engine.waits_only_for_remote_kvs


def test_a_lookup_that_broke_computes_the_prompt_and_an_aborted_wait_ends_the_pull():
    engine, broken, waiting = _engine(), _Peer(), _Peer()
    engine.add_request(EngineRequest("broken", PROMPT, THREE, remote_kv=RemoteKV(remote=broken)))
    engine.add_request(EngineRequest("aborted", PROMPT[::-1], THREE, remote_kv=RemoteKV(remote=waiting)))
    engine.step()
    broken.found.set_exception(RuntimeError("the server's half failed"))
    engine.abort_request("aborted")
    finals = _finals(engine, 5)
    assert finals["broken"].kv_pull == PullResult("failed") and finals["broken"].finish_reason == "length"
    assert finals["aborted"].finish_reason == "abort" and waiting.results == [PullResult("failed")]
    assert not engine.scheduler.requests and not engine.kv_connectors.held_blocks()


def test_the_prefill_sides_lease_leaves_on_the_final_output():
    engine = _engine()
    engine.add_request(EngineRequest("prefill", PROMPT, THREE,
                                     remote_kv=RemoteKV(lease_ttl_s=30.0, peer="router", engine_id="me")))
    handle = _finals(engine, 5)["prefill"].kv_lease
    assert handle["num_tokens"] == 16 and len(handle["remote_block_ids"]) == 4 and handle["remote_lease_id"]
    assert handle["remote_engine_id"] == "me" and handle["do_remote_prefill"] and not handle["do_remote_decode"]
    assert len(engine.kv_connectors.held_blocks()) == 4  # held for the decode side until it releases them
