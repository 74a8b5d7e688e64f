"""Several router processes on one port: ``kvmesh router --workers N``.

The parent binds the listening socket once and starts N worker processes that inherit it; every
worker accepts from the same kernel queue and runs its own router (its own index fed by the
replicas' event streams, its own predictions; in-flight counts are shared, see below). The parent carries no traffic:
it only restarts a worker that exits and stops them all on SIGTERM/SIGINT::

    parent (bind + supervise) ── listening socket ──▶ worker 0: HTTP app, index, loads
                                                  ├─▶ worker 1: ...
                                                  └─▶ worker N-1

Why one inherited socket and not SO_REUSEPORT: with SO_REUSEPORT each worker has its own accept
queue, and connections queued on a worker that dies are reset. With one shared queue a connection
is either accepted by a worker (its request was started there) or stays queued until a live
worker accepts it, so a crash loses only the requests the dead worker already held, and a
graceful stop (SIGTERM: stop accepting, answer what still arrives on open connections with
``Connection: close``, finish in-flight requests, then exit) loses none, keep-alive clients included.

The coupling to the HTTP front is one function, ``serve_router`` (one worker's life: build the
router, serve it on the inherited socket; responses carry ``x-kvmesh-router-worker: <index>``). On
SIGTERM a worker stops accepting and for ``drain_s`` answers what still arrives on its open
connections with ``Connection: close``, then finishes its in-flight requests (SIGINT skips the drain).
``RouterWorkers`` takes any picklable ``serve(sock, worker_index)`` callable. ``router_workers`` joins the workers' load
views through
shared memory (router/routing/shared_loads.py: each sees every worker's in-flight requests) and, inside
``kvmesh serve``, makes them follow serve's control router (router/control/follow.py). Their stored responses are
the database ``router.responses`` names, which every worker opens (replica/openai/responses_api/store.py: a
continuation by ``previous_response_id`` finds its conversation whichever worker takes it).
"""

from __future__ import annotations

import functools
import logging
import multiprocessing as mp
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import TYPE_CHECKING

from kvmesh.router.admission.shared_ledger import SharedLedger
from kvmesh.router.routing.shared_loads import SharedLoadTable

if TYPE_CHECKING:
    from kvmesh.router.config import ReplicaSpec, RouterConfig
    from kvmesh.router.control.router_server import RouterServer

logger = logging.getLogger(__name__)

MAX_AUTO_WORKERS = 8
"""Most router processes ``workers: 0`` (auto) starts."""


def spare_cores(reserved_cpus: float = 0.0) -> int:
    """Router processes for ``workers: 0``: this host's cores less ``reserved_cpus`` (replicas) and one
    for everything else (serve's control plane, Ray), between 1 and ``MAX_AUTO_WORKERS``."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(MAX_AUTO_WORKERS, int(cores - reserved_cpus - 1)))


def bind_listener(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """A listening TCP socket the workers inherit (ValueError with a reason if the port is taken)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ValueError(f"cannot listen on {host}:{port}: {e.strerror}; pick another --port") from None
    sock.listen(backlog)
    sock.set_inheritable(True)
    return sock


def _worker_main(serve: Callable, sock: socket.socket, index: int) -> None:
    os.setpgrp()  # Ctrl-C goes to the parent only; it stops the workers gracefully
    try:  # Linux: a parent that is killed takes its workers with it (none keeps serving the port alone)
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    serve(sock, index)


class RouterWorkers:
    """Starts, watches and restarts ``num_workers`` processes serving one listening socket."""

    def __init__(self, serve: Callable[[socket.socket, int], None], num_workers: int, host: str = "127.0.0.1",
                 port: int = 0, restart_delay_s: float = 0.5, max_restart_delay_s: float = 10.0,
                 min_uptime_s: float = 10.0, max_quick_exits: int = 5,
                 on_exit: Callable[[int], None] | None = None) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        self.serve = serve
        """``serve(sock, worker_index)``: runs one worker's server on the inherited socket until SIGTERM."""
        self.num_workers = num_workers
        """Worker processes kept running."""
        self.restart_delay_s = restart_delay_s
        """Wait before restarting a worker that exited; doubles while it keeps dying young."""
        self.max_restart_delay_s = max_restart_delay_s
        """Longest wait between restarts of a worker that keeps dying."""
        self.min_uptime_s = min_uptime_s
        """A worker that exits sooner than this after starting counts as failing to start."""
        self.max_quick_exits = max_quick_exits
        """Consecutive failed starts of one worker after which all stop (bad model path, port, ...)."""
        self.on_exit = on_exit
        """Called with a worker's index when it exited (e.g. to clear its row of shared counts)."""
        self.failed: str | None = None
        """Why the workers were given up on (None while they run or after a clean stop)."""
        self.sock = bind_listener(host, port)
        self.table: SharedLoadTable | None = None
        """The workers' ``SharedLoadTable`` when ``router_workers`` made one."""
        self.on_stop: list[Callable[[], object]] = []
        """Called once every worker has stopped (e.g. to release what they shared)."""
        self.restarts = [0] * num_workers
        """Times each worker was restarted."""
        self._ctx = mp.get_context("spawn")  # a fresh interpreter: no locks or threads copied mid-use
        self._procs: list = [None] * num_workers
        self._started_at = [0.0] * num_workers
        self._delay = [restart_delay_s] * num_workers
        self._quick_exits = [0] * num_workers
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self.sock.getsockname()[1]

    @property
    def pids(self) -> list[int | None]:
        """Process id of each worker now (None while one is being restarted)."""
        return [p.pid if p is not None and p.is_alive() else None for p in self._procs]

    def _spawn(self, index: int) -> None:
        proc = self._ctx.Process(target=_worker_main, args=(self.serve, self.sock, index),
                                 name=f"kvmesh-router-{index}", daemon=False)
        proc.start()
        self._procs[index] = proc
        self._started_at[index] = time.monotonic()

    def _supervise(self) -> None:
        due: dict[int, float] = {}  # worker index -> when to restart it
        while not self._stop.is_set():
            alive = [p.sentinel for p in self._procs if p is not None and p.is_alive()]
            timeout = min([0.5, *(t - time.monotonic() for t in due.values())])
            wait(alive, timeout=max(timeout, 0.0)) if alive else self._stop.wait(max(timeout, 0.0))
            now = time.monotonic()
            for i, proc in enumerate(self._procs):
                if self._stop.is_set():
                    return
                if proc is not None and not proc.is_alive() and i not in due:
                    if self.on_exit is not None:
                        self.on_exit(i)
                    lived = now - self._started_at[i]
                    self._quick_exits[i] = self._quick_exits[i] + 1 if lived < self.min_uptime_s else 0
                    if self._quick_exits[i] >= self.max_quick_exits:
                        self.failed = (f"router worker {i} exited {self._quick_exits[i]} times within "
                                       f"{self.min_uptime_s:.0f} s of starting (last exit code {proc.exitcode}); "
                                       "giving up - its error is in the log above")
                        logger.error("%s", self.failed)
                        self._stop.set()
                        return
                    self._delay[i] = (self.restart_delay_s if lived > 30 else
                                      min(self._delay[i] * 2, self.max_restart_delay_s))
                    logger.warning("router worker %d (pid %d) exited with code %s after %.1f s; restarting in "
                                   "%.1f s", i, proc.pid, proc.exitcode, lived, self._delay[i])
                    due[i] = now + self._delay[i]
                    self._procs[i] = None
                elif i in due and now >= due[i]:
                    del due[i]
                    self.restarts[i] += 1
                    self._spawn(i)

    def start(self) -> RouterWorkers:
        """Start the workers and supervise them from a background thread; returns at once."""
        for i in range(self.num_workers):
            self._spawn(i)
        self._thread = threading.Thread(target=self._supervise, name="kvmesh-router-workers", daemon=True)
        self._thread.start()
        return self

    def run(self) -> int:
        """Start, block until SIGTERM/SIGINT (or a worker keeps failing), stop every worker; exit code."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self._stop.set())
        self.start()
        while not self._stop.wait(1.0):
            pass
        self.stop()
        return 1 if self.failed else 0

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM every worker (each finishes its in-flight requests), SIGKILL what is left after timeout_s."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        procs = [p for p in self._procs if p is not None]
        for p in procs:
            if p.is_alive():
                os.kill(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for p in procs:
            p.join(max(deadline - time.monotonic(), 0.1))
            if p.is_alive():
                logger.warning("router worker pid %d did not stop in %.0f s; killing it", p.pid, timeout_s)
                p.kill()
                p.join()
        self.sock.close()
        for cleanup in self.on_stop:
            cleanup()


def router_workers(config: RouterConfig, replicas: list[ReplicaSpec] | None, num_workers: int,
                   control_url: str | None = None) -> RouterWorkers:
    """``num_workers`` processes serving the router app (``serve_router``) on ``config.host:config.port``,
    sharing their in-flight counts (router/routing/shared_loads.py); ``control_url``: they follow serve's
    control router for their replica set (router/control/follow.py)."""
    table = SharedLoadTable(num_workers)
    adm = config.admission  # one ledger: fair share, token buckets and the queue bound are the host's
    ledger = SharedLedger(num_workers, adm.fair_share_half_life_s, adm.max_tenants) if adm.enabled else None
    serve = functools.partial(serve_router, config, replicas,
                              setup=WorkerSetup(table, control_url, ledger))
    workers = RouterWorkers(serve, num_workers, config.host, config.port,
                            on_exit=functools.partial(_clear_rows, table, ledger))
    workers.table = table
    return workers


def _clear_rows(table: SharedLoadTable, ledger: SharedLedger | None, row: int) -> None:
    """A worker exited: its in-flight counts and its queue lengths are gone with it."""
    table.clear_row(row)
    if ledger is not None:
        ledger.clear_row(row)


# ---------------------------------------------------------------- one worker
WORKER_HEADER = b"x-kvmesh-router-worker"
"""Response header naming the worker that served a request (its index)."""


DEFAULT_DRAIN_S = 5.0
"""Seconds a worker told to stop keeps answering its open connections (with ``Connection: close``)."""


def serve_router(config: RouterConfig, replicas: list[ReplicaSpec] | None, sock: socket.socket, worker_index: int,
                 drain_s: float = DEFAULT_DRAIN_S, setup: WorkerSetup | None = None) -> None:
    """Serve the router on an inherited listening socket until SIGTERM (one worker's life).

    ``setup`` (``WorkerSetup``) joins the worker to its siblings: shared in-flight counts, and inside
    ``kvmesh serve`` the control router it follows.
    """
    from kvmesh.router.control.router_server import RouterServer

    server = RouterServer(config, replicas, extra_headers=[(WORKER_HEADER, str(worker_index).encode())])
    if setup is not None:
        setup(server, worker_index)
    server.run(sock=sock, graceful_s=config.upstream.request_timeout_s or 600.0, drain_s=drain_s)


@dataclass
class WorkerSetup:
    """What joins one worker process to its siblings (picklable: ``RouterWorkers`` hands it to each)."""

    table: SharedLoadTable
    """The host's shared in-flight counts (one row per worker)."""
    control_url: str | None = None
    """serve's control router, owner of the replica set; None: the worker's set is its own (``kvmesh router``)."""
    ledger: SharedLedger | None = None
    """The host's admission ledger (router/admission/shared_ledger.py); None: admission is off."""

    def __call__(self, server: RouterServer, worker_index: int) -> None:
        server.runtime.router.loads.share(self.table, worker_index)
        if self.ledger is not None and server.runtime.admission is not None:
            server.runtime.admission.share(self.ledger.for_row(worker_index))
        if self.control_url is not None:
            from kvmesh.router.control.follow import ControlFollower

            ControlFollower.join(server, self.control_url, self.table, worker_index)
