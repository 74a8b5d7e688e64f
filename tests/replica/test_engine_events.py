"""The engine publishes its block pool's events: one batch per step, in order, medium "GPU" (the engine's own cache on
every device, as vLLM's block pool writes it)."""

from __future__ import annotations

from kvmesh.events.config import PublisherConfig
from kvmesh.events.schema import BlockRemoved, BlockStored
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.engine.engine_request import EngineRequest
from kvmesh.replica.engine.llm_engine import LLMEngine
from kvmesh.replica.serving.sampling_params import SamplingParams
from kvmesh.replica.worker.fake_runner import FakeModelRunner

from ..events.events_testkit import wait_for


class RecordingPublisher:
    def __init__(self):
        self.batches: list[list] = []
        self.closed = False

    def publish(self, events):
        self.batches.append(list(events))

    def close(self):
        self.closed = True


def make_engine(publisher, num_blocks=16):
    runner = FakeModelRunner(num_kv_blocks=num_blocks, block_size=4)
    config = EngineConfig(model="fake", block_size=4, hash_seed=b"seed")
    return LLMEngine(config, model_runner=runner, skip_tokenizer_init=True, event_publisher=publisher)


def run(engine, rid, prompt, n=2):
    engine.add_request(EngineRequest(rid, prompt, SamplingParams(temperature=0.0, max_tokens=n)))
    steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    return steps


def test_one_batch_per_step_with_the_steps_stored_blocks():
    pub = RecordingPublisher()
    engine = make_engine(pub)
    steps = run(engine, "a", list(range(1, 13)), n=2)  # 3 full prompt blocks, stored in the prefill step
    assert 1 <= len(pub.batches) <= steps
    stored = [e for batch in pub.batches for e in batch if isinstance(e, BlockStored)]
    assert sum(len(e.block_hashes) for e in stored) == 3
    assert all(e.medium == "GPU" for e in stored)
    assert all(batch for batch in pub.batches), "empty batches are not published"
    engine.close()
    assert pub.closed


def test_evictions_are_published_as_block_removed():
    pub = RecordingPublisher()
    engine = make_engine(pub, num_blocks=8)  # 7 usable blocks: the second prompt evicts the first's
    run(engine, "a", list(range(1, 25)), n=1)
    run(engine, "b", list(range(100, 124)), n=1)
    removed = [e for batch in pub.batches for e in batch if isinstance(e, BlockRemoved)]
    assert removed


def test_events_reach_a_zmq_subscriber():
    import zmq

    runner = FakeModelRunner(num_kv_blocks=32, block_size=4)
    config = EngineConfig(model="fake", block_size=4, hash_seed=b"seed")
    events = PublisherConfig(endpoint="tcp://127.0.0.1:0", replay_endpoint=None, topic="kv-test")
    engine = LLMEngine(config, model_runner=runner, skip_tokenizer_init=True, events=events)
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(engine.event_publisher.endpoint)
    try:
        # PUB drops what it sends before the subscription has arrived: wait for it (the publisher's XPUB counts it)
        assert engine.event_publisher.wait_for_subscribers(timeout=30), "the subscription never arrived"
        run(engine, "r1", list(range(100, 112)), n=2)
        sub.poll(30_000)
        assert sub.poll(0), "no event batch arrived"
        topic, seq, payload = sub.recv_multipart()
        # The I/O thread counts a batch as sent just after its send returns: wait for that count
        seq = int.from_bytes(seq, "big")
        assert wait_for(lambda: engine.event_publisher.seq > seq, timeout=30), (seq, engine.event_publisher.seq)
        assert topic == b"kv-test" and seq >= 0 and payload
    finally:
        sub.close(linger=0)
        ctx.term()
        engine.close()


def test_a_reset_while_a_request_runs_frees_only_unheld_blocks_and_publishes_at_once():
    from kvmesh.events.schema import AllBlocksCleared

    pub = RecordingPublisher()
    engine = make_engine(pub, num_blocks=32)
    run(engine, "done", list(range(200, 212)), n=1)  # 3 cached blocks nobody holds
    engine.add_request(EngineRequest("running", list(range(1, 13)), SamplingParams(temperature=0.0, max_tokens=8)))
    engine.step()  # prefilled: its 3 blocks are cached and held
    published = len(pub.batches)
    assert engine.reset_unreferenced() == 3
    assert len(pub.batches) == published + 1  # sent now, not with the next step
    (removed,) = pub.batches[-1]
    assert isinstance(removed, BlockRemoved) and len(removed.block_hashes) == 3
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.reset_unreferenced() >= 3 and pub.batches[-1] == [AllBlocksCleared()]
    engine.kv_cache_manager.check_integrity()
    engine.close()
