"""What a replica publishes of its load (replica/server/load_publishing.py): its queue, each not-yet-computed prompt
less the prefix its router expected cached, the highest booking accepted per router; nothing when nothing changed."""

from __future__ import annotations

from types import SimpleNamespace

from kvmesh.replica.server.load_publishing import LoadPublishing


def _engine(requests: list[SimpleNamespace], running: int) -> SimpleNamespace:
    sched = SimpleNamespace(requests={r.request_id: r for r in requests}, running=requests[:running],
                            waiting=requests[running:])
    steps = SimpleNamespace(coefficients=lambda: (0.01, 0.0, 0.0), num_steps=7)
    return SimpleNamespace(scheduler=sched, kv_cache_manager=SimpleNamespace(usage=0.5),
                           prefill_rate=SimpleNamespace(tokens_per_s=1000.0), decode_step_time=steps)


def _request(rid: str, prompt: int, computed: int = 0) -> SimpleNamespace:
    return SimpleNamespace(request_id=rid, num_prompt_tokens=prompt, num_computed_tokens=computed)


def test_the_update_counts_the_queue_with_the_routers_expected_cache_and_its_bookings():
    running, waiting, direct = _request("a-0", 100, computed=100), _request("b-0", 300), _request("c-0", 50)
    engine = _engine([running, waiting, direct], running=1)
    pub = LoadPublishing(engine, publisher=None, interval_s=0.005)  # not started: update() is called by hand
    pub.accept(("router-1", 4, 120), ["b-0"], 300)  # the router expects 180 of its 300 tokens cached
    pub.accept(None, ["c-0"], 50)  # a client without a router: its whole prompt
    update = pub.update()
    assert (update.num_running, update.num_waiting, update.queued_prefill_tokens) == (1, 2, 120 + 50)
    assert update.accepted == {"router-1": 4}
    assert update.decode_step_s == 0.01 and update.prefill_tokens_per_s == 1000.0
    assert pub.update() is None  # unchanged: nothing to send
    waiting.num_computed_tokens = 200  # computed past the expected prefix: what is left counts
    assert pub.update().queued_prefill_tokens == 100 + 50
    del engine.scheduler.requests["b-0"]
    engine.scheduler.waiting.remove(waiting)
    assert pub.update().queued_prefill_tokens == 50
    pub._cached["b-0"] = (180, 0.0)  # accepted long ago
    pub.update(force=True)
    assert "b-0" not in pub._cached  # a finished request's expectation is forgotten
