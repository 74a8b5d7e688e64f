"""The engine's grammar compiles, in processes that can be stopped (xgrammar has no way to interrupt a compile):

    submit(key, params, tenant, request id) ─ one job per spec; a second request for it waits on the same job
      │ waiting jobs: one queue per tenant (the one the router named, else ``user``: openai/compile_tenant.py),
      │ taken in turns, oldest first within each
      ▼
    compile_processes workers: ``python -m kvmesh.replica.engine.grammar_worker`` (a lean program that loads
      │ xgrammar's native compiler only: it starts in about 0.3 s of CPU, not 5 s)
      │ a job past compile_timeout_s: its worker is killed and replaced, its requests fail
      │ a job whose requests all left (aborted, finished): dequeued, or its worker killed and replaced
      ▼
    the job's future: the CompiledGrammar (read back here, for this engine's tokenizer), or the error, with the
    seconds its process worked (``compile_s``: what its requests are charged)

One dispatcher thread ("kvmesh-grammar") owns the workers; the engine thread only submits and releases. The pool
starts on the first compile, or earlier by ``warm`` (``StructuredOutputsConfig.warm_start``), and ``close`` ends
its thread and processes. Its counters (``stats``) are the replica's grammar metrics: compile seconds, compiles by
outcome, compiles running and waiting.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import subprocess
import threading
import time
from collections import OrderedDict, deque
from concurrent.futures import Future
from multiprocessing.connection import wait
from typing import TYPE_CHECKING

from kvmesh.replica.engine.grammar_process import CompileProcess, start_worker
from kvmesh.replica.engine.grammar_text import compile_job
from kvmesh.replica.engine.xgrammar_backend import compiled_from_json, error_message

if TYPE_CHECKING:
    from kvmesh.replica.serving.grammar_config import StructuredOutputsConfig
    from kvmesh.replica.serving.structured_outputs import StructuredOutputsParams

logger = logging.getLogger(__name__)
OUTCOMES = ("compiled", "failed", "timed_out", "cancelled")
"""How a compile ends (the ``outcome`` label of kvmesh_grammar_compiles_total)."""


class CompileTimeout(Exception):
    """A compile ran past compile_timeout_s and was stopped."""


class CompileFuture(Future):
    """A compile's future, with the seconds its process spent on it once it ended (what its requests are charged:
    engine/structured_output.py)."""

    compile_s: float = 0.0


class CompileJob:
    """One spec's compile and the requests waiting for it."""

    __slots__ = ("id", "key", "params", "tenant", "future", "waiters", "started")

    def __init__(self, job_id: int, key: tuple, params: StructuredOutputsParams, tenant: str) -> None:
        self.id, self.key, self.params, self.tenant = job_id, key, params, tenant
        self.future = CompileFuture()
        self.waiters: set[str] = set()
        self.started: float | None = None  # when a worker took it


class GrammarPool:
    """Compiles on ``config.compile_processes`` workers, fairly by tenant (module doc)."""

    def __init__(self, tokenizer_info: str, info, config: StructuredOutputsConfig) -> None:
        self.config = config
        self._info_json, self._info = tokenizer_info, info  # the workers' copy, and this process's
        self._queues: OrderedDict[str, deque[CompileJob]] = OrderedDict()  # tenant -> its waiting jobs
        self._jobs: dict[tuple, CompileJob] = {}  # spec key -> its job, until it ends
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = multiprocessing.Pipe(duplex=False)
        self._wake_pending = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self.worker_pids: tuple[int, ...] = ()  # the compile processes now (the dispatcher's, read by anyone)
        self.stats = {"compile_seconds": 0.0, "running": 0, "waiting": 0, **{outcome: 0 for outcome in OUTCOMES}}

    def warm(self) -> None:
        """Start the compile processes now, with no compile to run yet."""
        with self._lock:
            self._start_dispatcher()

    def _start_dispatcher(self) -> None:
        """The dispatcher thread, unless it runs (the lock held): it starts the workers."""
        if self._thread is None or not self._thread.is_alive():  # the first compile, or after a failure
            self._thread = threading.Thread(target=self._run, name="kvmesh-grammar", daemon=True)
            self._thread.start()

    def submit(self, key: tuple, params: StructuredOutputsParams, tenant: str, request_id: str) -> Future:
        """The future of ``key``'s compile, ``request_id`` among those waiting for it."""
        with self._lock:
            job = self._jobs.get(key)
            if job is None:
                job = self._jobs[key] = CompileJob(next(self._ids), key, params, tenant)
                self._queues.setdefault(tenant, deque()).append(job)
                self.stats["waiting"] += 1
            job.waiters.add(request_id)
            self._start_dispatcher()
        self._wake()
        return job.future

    def release(self, key: tuple, request_id: str) -> None:
        """``request_id`` no longer waits for ``key``'s compile; the last to leave cancels it (module doc)."""
        with self._lock:
            job = self._jobs.get(key)
            if job is None or request_id not in job.waiters:
                return
            job.waiters.discard(request_id)
            if job.waiters:
                return
            if job.started is None:  # waiting: dequeued now
                queue = self._queues[job.tenant]
                queue.remove(job)
                if not queue:
                    del self._queues[job.tenant]
                self._end(job, "cancelled")
                job.future.cancel()
                return
        self._wake()  # running: the dispatcher kills its worker

    def close(self, wait_s: float = 10.0) -> None:
        """Stop every compile and the dispatcher thread (the engine is closing), waiting up to ``wait_s`` for them."""
        with self._lock:
            self._closed = True
        self._wake()
        if self._thread is not None and wait_s > 0 and self._thread is not threading.current_thread():
            self._thread.join(wait_s)

    # ------------------------------------------------------------ the dispatcher thread
    def _wake(self) -> None:
        """Get the dispatcher round once more (one message in the pipe at most: it never fills)."""
        if self._wake_pending:
            return
        self._wake_pending = True
        try:
            self._wake_w.send_bytes(b"")
        except OSError:  # closed
            pass

    def _end(self, job: CompileJob, outcome: str) -> None:
        """Forget ``job`` (the lock held)."""
        if self._jobs.get(job.key) is job:
            del self._jobs[job.key]
        self.stats["running" if job.started is not None else "waiting"] -= 1
        self.stats[outcome] += 1

    def _next_job(self) -> CompileJob | None:
        """The next tenant's oldest waiting job (the lock held); that tenant goes to the back."""
        if not self._queues:
            return None
        tenant, queue = next(iter(self._queues.items()))
        job = queue.popleft()
        if queue:
            self._queues.move_to_end(tenant)
        else:
            del self._queues[tenant]
        return job

    def _run(self) -> None:
        workers: list[CompileProcess] = []
        try:
            while not self._closed:
                self._stop_overdue(workers)
                workers = self._replace_dead(workers)
                self.worker_pids = tuple(w.process.pid for w in workers)
                self._assign(workers)
                ready = wait([self._wake_r] + [w.conn for w in workers], self._until_next_deadline(workers))
                if self._wake_r in ready:
                    # Clear, then read one message. A wake sent meanwhile leaves its own message for the next round;
                    # draining them all here could eat it while the flag stays set, and no wake would be sent again.
                    self._wake_pending = False
                    self._wake_r.recv_bytes()
                for w in workers:
                    if w.conn in ready:
                        self._receive(w)
        except Exception:  # no compile process could start: the waiting requests fail, the next submit retries
            logger.exception("the grammar compile pool stopped")
        finally:
            for w in workers:
                w.kill()
            self.worker_pids = ()
            with self._lock:
                for job in list(self._jobs.values()):
                    self._end(job, "cancelled")
                    job.future.cancel()

    def _replace_dead(self, workers: list[CompileProcess]) -> list[CompileProcess]:
        alive = []
        for w in workers:
            if w.alive():
                alive.append(w)
            else:
                w.kill()  # joins it and closes its pipe
        if len(alive) < self.config.compile_processes and all(w.ready for w in alive):
            # One at a time (the next once this one says ready): on a busy machine the first compile waits for one
            # process's start, not for a share of several starting at once.
            alive.append(start_worker(self._info_json, self.config.cache_memory))
        return alive

    def _assign(self, workers: list[CompileProcess]) -> None:
        for w in workers:
            if w.ready and w.job is None:
                with self._lock:
                    job = self._next_job()
                    if job is None:
                        return
                    job.started = time.monotonic()
                    self.stats["waiting"] -= 1
                    self.stats["running"] += 1
                w.job = job
                w.conn.send((job.id, *compile_job(job.params, self.config.any_whitespace)))

    def _stop_overdue(self, workers: list[CompileProcess]) -> None:
        """Kill the workers whose job overran or lost its requests (they are replaced on the next turn)."""
        now, timeout = time.monotonic(), self.config.compile_timeout_s
        for w in workers:
            job = w.job
            if job is None or (job.waiters and now - job.started <= timeout):
                continue
            w.kill()
            with self._lock:
                overran = bool(job.waiters)
                self._end(job, "timed_out" if overran else "cancelled")
                self.stats["compile_seconds"] += now - job.started
            job.future.compile_s = now - job.started
            if overran:
                logger.warning("a grammar compile overran %g s (%s); its process was replaced", timeout,
                               job.params.field)
                job.future.set_exception(CompileTimeout(f"did not compile within {timeout:g} s; send a simpler one"))
            else:
                job.future.cancel()

    def _until_next_deadline(self, workers: list[CompileProcess]) -> float | None:
        started = [w.job.started for w in workers if w.job is not None]
        return None if not started else max(0.0, min(started) + self.config.compile_timeout_s - time.monotonic())

    def _receive(self, w: CompileProcess) -> None:
        try:
            message = w.conn.recv()
        except (EOFError, OSError):  # it died (killed from outside, out of memory): replaced on the next turn
            message = (w.job.id, None, "the compile process died", 0.0) if w.job is not None else None
            try:
                w.process.wait(1)
            except subprocess.TimeoutExpired:
                pass
        if message is None:
            return
        if message == ("ready",):
            w.ready = True
            return
        job, w.job = w.job, None
        _, result, error, seconds = message
        error = error_message(error) if error is not None else None
        compiled = None
        if result is not None:
            try:
                compiled = compiled_from_json(result, self._info)
            except Exception as e:  # a version mismatch would be a bug: the request still gets an answer
                error = f"the compiled grammar could not be read back: {error_message(e)}"
        with self._lock:
            self._end(job, "compiled" if compiled is not None else "failed")
            self.stats["compile_seconds"] += seconds
        job.future.compile_s = seconds
        if compiled is not None:
            job.future.set_result(compiled)
        else:
            job.future.set_exception(RuntimeError(error))
