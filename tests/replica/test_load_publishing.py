"""What a replica publishes of its load (replica/server/load_publishing.py): its queue, each not-yet-computed prompt
less the prefix its router expected cached, the highest booking accepted per router; nothing when nothing changed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from kvmesh.replica.server.load_publishing import LoadPublishing


def _engine(requests: list[SimpleNamespace], running: int, max_num_seqs: int = 8) -> SimpleNamespace:
    sched = SimpleNamespace(requests={r.request_id: r for r in requests}, running=requests[:running],
                            waiting=requests[running:], left_waiting=len(requests) - running)  # each tried by a step
    steps = SimpleNamespace(coefficients=lambda: (0.01, 0.0, 0.0), num_steps=7)
    return SimpleNamespace(scheduler=sched, config=SimpleNamespace(max_num_seqs=max_num_seqs),
                           kv_cache_manager=SimpleNamespace(usage=0.5),
                           prefill_rate=SimpleNamespace(tokens_per_s=1000.0), decode_step_time=steps,
                           output_processor=SimpleNamespace(finish_listeners=[]))


def _finish(engine: SimpleNamespace, request: SimpleNamespace) -> None:
    """What the engine thread does as a request leaves: out of the scheduler, then the finish listeners."""
    sched = engine.scheduler
    del sched.requests[request.request_id]
    for queue in (sched.running, sched.waiting):
        if request in queue:
            queue.remove(request)
    for listener in engine.output_processor.finish_listeners:
        listener()


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
    pub._cached["b-0"] = (180, 300, 0.0, False)  # accepted long ago, never seen in the engine
    pub.update(force=True)
    assert "b-0" not in pub._cached  # a finished request's expectation is forgotten


def test_a_request_the_engine_refuses_leaves_the_queue_and_the_intake_at_once():
    """Counted from its queueing, a request the engine then turns away (a 400 or a 503) is taken back: a client whose
    requests are refused makes no replica look busier to the routers. Its booking stays acknowledged."""
    engine = _engine([], running=0)
    pub = LoadPublishing(engine, publisher=None, interval_s=0.005)
    pub.accept(("router-1", 1, 40), ["kept-0"], 100)
    kept = pub.update(force=True)
    pub.accept(("router-1", 2, 5000), ["refused-0", "refused-1"], 6000)  # parallel sampling: two engine requests
    pub.refused(["refused-0", "refused-1"])
    after = pub.update(force=True)
    assert (after.num_waiting, after.queued_prefill_tokens) == (kept.num_waiting, kept.queued_prefill_tokens)
    assert after.recent_prefill == pytest.approx(kept.recent_prefill, abs=1e-3)
    assert after.recent_prompt == pytest.approx(kept.recent_prompt, abs=1e-3)
    assert after.recent_requests == pytest.approx(kept.recent_requests, abs=1e-6)
    assert after.accepted == {"router-1": 2}  # the router stops counting it, as for one that ran
    pub.refused(["refused-0", "never-accepted"])  # twice, or unknown: nothing more is taken
    assert pub.update(force=True).recent_prefill == pytest.approx(kept.recent_prefill, abs=1e-3)


def test_a_request_the_engine_has_not_taken_in_yet_counts_as_its_next_step_will_find_it():
    """Accepted before the engine thread takes it in, a request counts at once: as running when the next step starts
    it (a free slot, nothing waiting), so no router reads it as a sign that every slot is taken."""
    one_running = _request("a-0", 100, computed=100)
    engine = _engine([one_running], running=1, max_num_seqs=8)
    pub = LoadPublishing(engine, publisher=None, interval_s=0.005)
    pub.accept(("router-1", 1, 120), ["b-0"], 300)  # queued by the handler; the engine thread has not taken it in
    update = pub.update()
    assert (update.num_running, update.num_waiting) == (2, 0)
    assert (update.queued_prefill_tokens, update.accepted) == (120, {"router-1": 1})
    joined = _request("b-0", 300)
    engine.scheduler.requests["b-0"] = joined
    engine.scheduler.running.append(joined)
    assert pub.update() is None  # the same load, now counted by the engine: nothing new to send
    del engine.scheduler.requests["b-0"]
    engine.scheduler.running.remove(joined)
    update = pub.update()
    assert (update.num_running, update.num_waiting, update.queued_prefill_tokens) == (1, 0, 0)  # it left
    assert "b-0" not in pub._cached


@pytest.mark.parametrize("case", ["behind a waiting request", "every slot taken"])
def test_a_joining_request_the_next_step_cannot_start_counts_as_waiting(case):
    queue = [_request("a-0", 100, computed=100), _request("a-1", 100)]
    engine = _engine(queue, running=2 if case == "every slot taken" else 1, max_num_seqs=2)
    pub = LoadPublishing(engine, publisher=None, interval_s=0.005)
    pub.accept(None, ["b-0", "b-1"], 50)  # two engine requests of one accept (n=2)
    update = pub.update()
    assert (update.num_running, update.num_waiting) == ((2, 2) if case == "every slot taken" else (1, 3))


def test_joining_requests_fill_the_free_slots_and_wait_past_them():
    engine = _engine([_request("a-0", 100, computed=100)], running=1, max_num_seqs=3)
    pub = LoadPublishing(engine, publisher=None, interval_s=0.005)
    pub.accept(None, ["b-0", "b-1", "b-2"], 50)
    update = pub.update()
    assert (update.num_running, update.num_waiting) == (3, 1)


class _Publisher:
    def __init__(self) -> None:
        self.updates: list = []

    def publish_load(self, update) -> None:
        self.updates.append(update)


def test_an_accepted_request_is_published_at_once_whatever_the_interval():
    import time

    busy = _request("a-0", 100)
    engine = _engine([busy], running=1)
    publisher = _Publisher()
    pub = LoadPublishing(engine, publisher, interval_s=30.0).start()  # steps' changes: at most every 30 s
    try:
        deadline = time.monotonic() + 5
        while not publisher.updates and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(publisher.updates) == 1  # the first update; the next step-driven one is 30 s away
        pub.accept(("router-1", 1, 40), ["b-0"], 40)
        while len(publisher.updates) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [u.accepted for u in publisher.updates] == [{}, {"router-1": 1}]
        assert publisher.updates[1].queued_prefill_tokens == 100 + 40
    finally:
        pub.close()


def _wait_for(publisher: _Publisher, condition, timeout_s: float = 5.0) -> float:
    """Seconds until the last update published meets ``condition``."""
    import time

    started = time.monotonic()
    while not (publisher.updates and condition(publisher.updates[-1])) and time.monotonic() - started < timeout_s:
        time.sleep(0.002)
    return time.monotonic() - started


def test_a_request_that_leaves_is_published_at_once_whatever_the_interval():
    """A conversation's next turn goes through another router as soon as the answer is read: that router must find
    the replica without the turn before, not the last busy update until the next step-driven one."""
    first, second = _request("a-0", 100, computed=100), _request("b-0", 100, computed=100)
    engine = _engine([first, second], running=2)
    publisher = _Publisher()
    pub = LoadPublishing(engine, publisher, interval_s=30.0).start()  # steps' changes: at most every 30 s
    try:
        _wait_for(publisher, lambda u: u.num_running == 2)
        _finish(engine, first)  # one left, one still running: not idle
        assert _wait_for(publisher, lambda u: u.num_running == 1) < 1.0
    finally:
        pub.close()
    assert engine.output_processor.finish_listeners == []  # closed: the engine no longer wakes it


def test_a_replica_that_goes_idle_publishes_it_at_once_not_a_second_later():
    """The last request leaving between two step updates, with no word from the engine (accepted, never joined):
    the thread finds no request after the interval and says so before it sleeps."""
    from kvmesh.replica.server.load_publishing import IDLE_WAIT_S

    busy = _request("a-0", 100, computed=100)
    engine = _engine([busy], running=1)
    publisher = _Publisher()
    pub = LoadPublishing(engine, publisher, interval_s=0.05).start()
    try:
        _wait_for(publisher, lambda u: u.num_running == 1)
        engine.scheduler.requests.clear()  # gone without the finish listeners
        engine.scheduler.running.clear()
        assert _wait_for(publisher, lambda u: u.num_running == 0) < IDLE_WAIT_S / 2
    finally:
        pub.close()
