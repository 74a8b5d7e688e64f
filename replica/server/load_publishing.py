"""A replica publishes its own load on its event stream (events/load.py), for every router at once.

    handler   accept(booking, request ids, prompt tokens)   a request was queued (completions.py)
    engine    a request left the scheduler (finished, aborted, failed)    OutputProcessor.finish_listeners
    thread    at once when a request is accepted or leaves, every ``interval_s`` while the engine has requests,
              and at once when it has none left: the load, if it changed since the last update
              -> ``ZmqEventPublisher.publish_load``

An accepted request is published without waiting out the interval: the routers that did not send it must count it before
their next choice (a burst reaches several routers within a network hop). So is a request that leaves: a conversation's
next turn, sent through another router as soon as the answer is read, would otherwise find its replica still published
busy with the turn before and go elsewhere. The interval caps the updates that engine steps cause. The load is read
racily off the engine thread's state, as ``/load`` reads it (engine/load_fields.py ``queue_counts``). A request
accepted that the engine thread has not taken in yet, or taken in and not yet tried by a step, counts as running when
the engine's next step will start it (its last step left nothing waiting and a running slot is free), else as
waiting: a router reads waiting requests beside running ones as every slot taken (router/admission/room.py), and a
request joining an engine with free slots made admission send one request at a time. A request the engine has not
started computing counts its prompt less the prefix its router expected cached (the booking's uncached tokens,
replica/openai/router_booking.py): without a booking, its whole prompt.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from kvmesh.events.publish.load_ledger import LoadLedger
from kvmesh.replica.engine.load_fields import queue_counts, read_racily

if TYPE_CHECKING:
    from kvmesh.events.load import ReplicaLoadUpdate
    from kvmesh.events.publish.publisher import ZmqEventPublisher
    from kvmesh.replica.engine.llm_engine import LLMEngine
    from kvmesh.replica.openai.router_booking import Booking

logger = logging.getLogger(__name__)

IDLE_WAIT_S = 1.0
"""Seconds the thread sleeps while the engine has no requests (an accept wakes it)."""
FORGET_S = 1.0
"""Seconds after its accept a request not in the engine is forgotten (the engine took it in and it left, or it
never joined)."""
_NONE = (0, 0, 0.0, True)


class LoadPublishing:
    """The replica's load updates: what it accepted per router, and the thread that publishes."""

    def __init__(self, engine: LLMEngine, publisher: ZmqEventPublisher, interval_s: float) -> None:
        self.engine, self.publisher, self.interval_s = engine, publisher, interval_s
        self.ledger = LoadLedger()
        self._lock = threading.Lock()
        self._cached: dict[str, tuple[int, int, float, bool]] = {}  # engine request id -> (prompt tokens its router
        # expected cached, its prompt tokens, when accepted, seen in the engine): kept until it left the engine (or
        # never joined it within FORGET_S)
        self._last: tuple | None = None
        self._wake = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="kvmesh-load-publisher", daemon=True)

    def start(self) -> LoadPublishing:
        self._thread.start()
        self.engine.output_processor.finish_listeners.append(self._wake.set)  # a request left: published at once
        return self

    def close(self) -> None:
        listeners = self.engine.output_processor.finish_listeners
        if self._wake.set in listeners:
            listeners.remove(self._wake.set)
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=2.0)

    def accept(self, booking: Booking | None, request_ids: list[str], prompt_tokens: int) -> None:
        """A request's engine requests ``request_ids`` were queued (handler thread)."""
        uncached = prompt_tokens if booking is None else min(prompt_tokens, booking[2])
        with self._lock:
            now = time.monotonic()
            self.ledger.accept(None if booking is None else booking[:2], prompt_tokens, uncached, now)
            for rid in request_ids:
                self._cached[rid] = (prompt_tokens - uncached, prompt_tokens, now, False)
        self._wake.set()

    def refused(self, request_ids: list[str]) -> None:
        """The engine requests of one ``accept`` were refused before they ran (handler thread): their queue entries
        go at once and the request's intake leaves the published sums, so requests the engine turns away make no
        replica look busier."""
        with self._lock:
            entries = [e for e in (self._cached.pop(rid, None) for rid in request_ids) if e is not None]
            if entries:  # one accept counted the request's intake once, whatever its engine requests
                hit, prompt, at, _ = entries[0]
                self.ledger.withdraw(prompt, prompt - hit, at, time.monotonic())
        self._wake.set()

    def cache_reset(self) -> None:
        """The prefix cache was reset (``POST /reset_prefix_cache``): the ledger's decayed sums restart, published
        at once."""
        with self._lock:
            self.ledger.cache_reset()
            self._last = None
        self._wake.set()

    def update(self, force: bool = False) -> ReplicaLoadUpdate | None:
        """The load to publish now; None when it did not change since the last (unless ``force``)."""
        engine = self.engine
        sched = engine.scheduler
        requests = read_racily(lambda: list(sched.requests.values()))
        with self._lock:
            cached = self._cached
            joining, joining_tokens = self._joining({r.request_id for r in requests} if cached else set())
            queued = joining_tokens + sum(
                max(0, r.num_prompt_tokens - max(r.num_computed_tokens, cached.get(r.request_id, _NONE)[0]))
                for r in requests)
            running, waiting = queue_counts(sched, joining, engine.config.max_num_seqs)
            key = (running, waiting, queued, tuple(self.ledger.accepted.items()))
            if key == self._last and not force:
                return None
            self._last = key
            step = engine.decode_step_time.coefficients()
            return self.ledger.update(
                time.monotonic(), time.time(), running, waiting, queued, float(engine.kv_cache_manager.usage),
                engine.prefill_rate.tokens_per_s, None if step is None else step[0], engine.decode_step_time.num_steps)

    def _joining(self, live: set[str]) -> tuple[int, int]:
        """The requests accepted that the engine thread has not taken in yet, and their uncached prompt tokens;
        forgets those that left the engine (or never joined it within ``FORGET_S``). Under the lock."""
        cached, horizon = self._cached, time.monotonic() - FORGET_S
        joining = tokens = 0
        for rid, (hit, prompt, at, seen) in list(cached.items()):
            if rid in live:
                if not seen:
                    cached[rid] = (hit, prompt, at, True)
            elif seen or at < horizon:
                del cached[rid]
            else:
                joining, tokens = joining + 1, tokens + prompt - hit
        return joining, tokens

    def _run(self) -> None:
        due = 0.0  # when the steps' next update may go (a request accepted goes at once, not counted)
        while not self._stop:
            self._wake.clear()
            if not self._publish():
                return
            now = time.monotonic()
            if now >= due:
                due = now + self.interval_s
            if self._wake.wait(due - now):  # a request accepted meanwhile: published at once
                continue
            if not self.engine.scheduler.requests:  # idle: said at once (the routers' next choice must not find
                self._wake.clear()  # the last busy update), then nothing until a request is accepted or a second
                if not self._publish():  # passed
                    return
                self._wake.wait(IDLE_WAIT_S)

    def _publish(self) -> bool:
        """Publish the load if it changed; False after a failure (the thread stops, the routers poll ``/load``)."""
        try:
            update = self.update()
            if update is not None:
                self.publisher.publish_load(update)
        except Exception:  # pragma: no cover - a bug here must not stop the replica
            logger.exception("publishing the replica's load failed; routers fall back to polling /load")
            return False
        return True
