"""A pull's read, started and watched off the engine thread: one transfer worker thread per agent.

    engine thread                                   the agent's transfer worker thread
    read = PullRead(agent, peer, ...)  (blocks held)
    submit(read) ──────────────────────────────▶    start_read per holder tier (nixl's ``transfer`` copies here)
    read.outcome / read.over, between steps  ◀──    polls state(); on DONE or ERR releases the handle; sets flags
    read.give_up(KVTransferTimeout(...))  ──────▶   aborts the transfers; keeps polling until the transport lets go

Two flags, set once each: ``outcome`` (None, then ``"DONE"`` or the error the pull failed with: known as soon as
one tier errs or the engine gives up) and ``over`` (the transport confirmed that nothing more lands in the local
blocks: every transfer ended and let its handle go). A failed pull's blocks stay quarantined until ``over``: a
read that lands late must land in blocks nobody else was given. A transport that never confirms keeps them held.
The worker thread starts with the first read and exits once it has no read left (no thread outlives its reads).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import weakref

from kvmesh.replica.kv_transfer.agent import KVTransfer, KVTransferAgent
from kvmesh.replica.kv_transfer.errors import KVTransferError

logger = logging.getLogger(__name__)

SETTLE_POLL_S = 0.05
"""Seconds between checks of failed reads awaiting the transport's confirmation (one may never come)."""
WORKER_NICE = 10
"""The transfer worker thread's nice value while it starts a read (nixl copies there on host memory): such a copy
yields the CPU to the engine's steps (weight 110 against their 1024), yet is not starved past the pull's timeout
on a loaded machine, as 19 was (kvmesh bench kv-transfer --step-trace; BENCHMARKS.md, "KV transfer between
replicas")."""


class TierReads:
    """The reads of one pull, one per tier of the holder it reads from: in flight (PROC) while any is; DONE when
    all are; ERR when one is (``failed`` says so early, while another still runs)."""

    def __init__(self, transfers: list[KVTransfer], num_blocks: int) -> None:
        self.transfers, self.num_blocks = transfers, num_blocks

    def state(self) -> str:
        states = [t.state() for t in self.transfers]
        return "PROC" if "PROC" in states else "ERR" if "ERR" in states else "DONE"

    def failed(self) -> bool:
        return any(t.state() == "ERR" for t in self.transfers)

    def abort(self) -> None:
        for t in self.transfers:
            t.abort()

    def release(self) -> bool:
        released = [t.release() for t in self.transfers]  # every one asked, none skipped
        return all(released)


def start_tier_reads(agent: KVTransferAgent, peer: str, remote_ids: list[int], media: list[str],
                     local_ids: list[int]) -> tuple[TierReads, BaseException | None]:
    """One read per run of ``media`` (the holder's device blocks, then its host tier's), and the error that stopped
    a later one from starting (the ones already started are then aborted, still to be waited on)."""
    reads: list[KVTransfer] = []
    start = 0
    try:
        while start < len(remote_ids):
            end = start
            while end < len(remote_ids) and media[end] == media[start]:
                end += 1
            reads.append(agent.start_read(peer, remote_ids[start:end], local_ids[start:end], media[start]))
            start = end
    except BaseException as e:  # noqa: BLE001 - KVTransferError (dead peer) or ValueError (bad ids): the pull fails
        for read in reads:
            read.abort()
        return TierReads(reads, len(local_ids)), e
    return TierReads(reads, len(local_ids)), None


class PullRead:
    """One pull's read: set up on the engine thread, run by the agent's worker; the engine reads its flags only."""

    def __init__(self, agent: KVTransferAgent, peer: str, remote_ids: list[int], media: list[str],
                 local_ids: list[int]) -> None:
        self.agent, self.peer, self.remote_ids, self.media, self.local_ids = agent, peer, remote_ids, media, local_ids
        self.outcome: str | BaseException | None = None
        """None while undecided; ``"DONE"`` (only once over: the bytes are all here) or the pull's error."""
        self.over = False
        """The transport confirmed that nothing more lands in the local blocks (or nothing was ever started)."""
        self.reads: TierReads | None = None
        self._lock = threading.Lock()
        self._abort_asked = False
        self._abort_sent = False
        self._raised = False

    def give_up(self, error: BaseException) -> str | BaseException:
        """Fail the pull with ``error`` unless it already ended (engine thread: its timeout, the engine stopping);
        the worker aborts the transfers. The outcome, which is ``"DONE"`` when the read won the race."""
        with self._lock:
            if self.outcome is None:
                self.outcome = error
                self._abort_asked = True
            return self.outcome

    def _fail(self, error: BaseException) -> None:
        with self._lock:
            if self.outcome is None:
                self.outcome = error
            self._abort_asked = True

    def _end(self, state: str) -> None:
        with self._lock:
            if self.outcome is None:
                self.outcome = "DONE" if state == "DONE" else KVTransferError(
                    f"reading {len(self.local_ids)} KV blocks from {self.peer!r} ended in state {state}; "
                    "recompute them")
            self.over = True

    # -- the worker thread --

    def start(self) -> None:
        if self._abort_asked:  # given up before it started: nothing to wait for
            self.over = True
            return
        with _yielding_cpu():
            self.reads, error = start_tier_reads(self.agent, self.peer, self.remote_ids, self.media, self.local_ids)
        if error is not None:
            self._fail(error)
            self._abort_sent = True  # start_tier_reads aborted the ones that started
            if not self.reads.transfers:
                self.over = True

    def check(self) -> bool:
        """Advance the read without waiting; True once it is over."""
        if self.over:
            return True
        reads = self.reads
        if self._abort_asked and not self._abort_sent:
            self._abort_sent = True
            reads.abort()
        state = reads.state()
        if state == "PROC":
            if reads.failed():  # one tier erred while another still writes: fail now, wait for the rest
                self._fail(KVTransferError(f"reading {len(self.local_ids)} KV blocks from {self.peer!r} failed "
                                           "on one of the holder's tiers; recompute them"))
            return False
        if state == "ERR":
            self._fail(KVTransferError(f"reading {len(self.local_ids)} KV blocks from {self.peer!r} ended in "
                                       "state ERR; recompute them"))
        if not reads.release():  # the transport still holds it (nixl refuses while in flight): ask again later
            return False
        self._end(state)
        return True


class ReadWorker:
    """The transfer worker thread of one agent: starts the reads handed to it and polls them until over."""

    def __init__(self, poll_interval_s: float, name: str) -> None:
        self.poll_interval_s, self.name = poll_interval_s, name
        self._cond = threading.Condition()
        self._queue: list[PullRead] = []
        self._active: list[PullRead] = []
        self._thread: threading.Thread | None = None
        self.on_progress = None
        """Called (from this thread) when a read's outcome or over flag changes: the engine's wake-up."""

    def submit(self, read: PullRead, on_progress=None) -> None:
        with self._cond:
            self._queue.append(read)
            if on_progress is not None:
                self.on_progress = on_progress
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"kv-reads-{self.name}", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._queue and not self._active:
                    self._thread = None  # a later submit starts a fresh thread
                    return
                new, self._queue = self._queue, []
            for read in new:
                self._guard(read, read.start)
                self._active.append(read)
            before = [(r.outcome is None, r.over) for r in self._active]
            for read in self._active:
                self._guard(read, read.check)
            changed = before != [(r.outcome is None, r.over) for r in self._active]
            self._active = [r for r in self._active if not r.over]
            if changed and self.on_progress is not None:
                self.on_progress()
            if self._active:
                live = any(r.outcome is None for r in self._active)  # else only failed reads awaiting confirmation
                with self._cond:
                    if not self._queue:
                        self._cond.wait(self.poll_interval_s if live else max(self.poll_interval_s, SETTLE_POLL_S))

    @staticmethod
    def _guard(read: PullRead, step) -> None:
        try:
            step()
        except BaseException as e:  # noqa: BLE001 - a transport bug: the pull fails, its blocks stay held
            if not read._raised:  # polled again later (it may still end); said once
                read._raised = True
                logger.exception("KV read from %s: the transport raised; its blocks stay quarantined", read.peer)
            read._fail(e)


@contextlib.contextmanager
def _yielding_cpu():
    """This thread at nice ``WORKER_NICE`` inside the block (Linux: nice is per thread): on host memory a read
    copies inside ``start_read``, and where cores are short the copy must yield to the engine's steps. Only the
    copy (nixl lets go of the GIL meanwhile): Python run at a low priority would hold the GIL while starved, and
    the engine thread would wait on it. Left alone where the priority could not be raised back afterwards."""
    tid = threading.get_native_id()
    try:
        base = os.getpriority(os.PRIO_PROCESS, tid)
        lowered = base < WORKER_NICE and _can_renice(tid, base)
    except (AttributeError, OSError):  # not Linux
        lowered = False
    if lowered:
        os.setpriority(os.PRIO_PROCESS, tid, WORKER_NICE)
    try:
        yield
    finally:
        if lowered:
            os.setpriority(os.PRIO_PROCESS, tid, base)


_RENICE: dict[str, bool] = {}


def _can_renice(tid: int, base: int) -> bool:
    """Whether this process may raise a thread's priority back to ``base`` (root, or RLIMIT_NICE allows it)."""
    if "ok" not in _RENICE:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, base + 1)
            os.setpriority(os.PRIO_PROCESS, tid, base)
            _RENICE["ok"] = True
        except OSError:
            _RENICE["ok"] = False
            logger.info("KV reads copy at the engine's priority: this process may not raise a thread's back")
    return _RENICE["ok"]


_WORKERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_WORKERS_LOCK = threading.Lock()


def read_worker(agent: KVTransferAgent) -> ReadWorker:
    """The agent's transfer worker (one per agent, made on first use)."""
    with _WORKERS_LOCK:
        worker = _WORKERS.get(agent)
        if worker is None:
            worker = _WORKERS[agent] = ReadWorker(agent.config.poll_interval_s, agent.name)
        return worker


def wait_over(read: PullRead, timeout_s: float) -> bool:
    """Wait (a tool's thread, not the engine's) until the read is over; False if it is not within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not read.over:
        if time.monotonic() > deadline:
            return False
        time.sleep(read.agent.config.poll_interval_s)
    return True
