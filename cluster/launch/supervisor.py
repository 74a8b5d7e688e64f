"""Keeps the configured number of replicas alive and the router's replica set in step with them.

Every ``interval_s`` the supervisor asks each replica actor for its endpoints:

    answer, same incarnation (pid, URL)      -> nothing to do
    answer, new incarnation (Ray restarted   -> re-register with the router: it drops the replica's
      it, or we replaced it)                    old prefix tree and subscribes to the new stream,
                                                whose first batch is AllBlocksCleared
    no answer, actor alive or restarting     -> report once; the router already routes around it
    no answer, actor DEAD (Ray's restarts    -> REPLACE it: a new actor under the same replica id
      exhausted, or killed for good)            (``spawn``), after a back-off when it crash-loops

Restarts (Ray's and ours) are counted per replica in a sliding window of ``restart_window_s``:
up to ``max_restarts_per_window`` of them are replaced at once; each further one waits
``replace_backoff_s``, doubling up to ``replace_backoff_max_s`` -- so a replica that keeps
crashing costs little, and the cluster still comes back to full size once the cause is gone.
Without ``spawn`` (a caller that cannot make actors) a dead replica is deregistered instead.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict

from kvmesh.cluster.config.roles import Role
from kvmesh.cluster.router_client import RouterClient

if TYPE_CHECKING:
    from ray.actor import ActorHandle

logger = logging.getLogger(__name__)


class ReplicaEndpoints(TypedDict, total=False):
    """What a replica actor's ``endpoints()`` answers, the fields read here."""

    http_url: str
    """Where the replica serves HTTP."""
    events_endpoint: str | None
    """Its KV event stream (None: no events)."""
    replay_endpoint: str | None
    """Its replay/snapshot socket."""
    pid: int
    """The actor's process id (a new one: the actor was restarted)."""
    started_at: float
    """When the actor started."""


@dataclass(frozen=True, slots=True)
class SupervisorConfig:
    """How the supervisor watches and replaces replicas."""

    interval_s: float = 1.0
    """Seconds between two looks at every replica."""
    call_timeout_s: float = 5.0
    """Seconds an actor may take to answer ``endpoints()`` before it counts as down."""
    max_restarts_per_window: int = 3
    """Restarts of one replica within ``restart_window_s`` that are replaced without delay."""
    restart_window_s: float = 600.0
    """Sliding window (seconds) over which restarts are counted."""
    replace_backoff_s: float = 1.0
    """Delay before replacing a replica past ``max_restarts_per_window``; doubles per further restart."""
    replace_backoff_max_s: float = 60.0
    """Longest delay before a replacement."""

    def __post_init__(self) -> None:
        for name in ("interval_s", "call_timeout_s", "restart_window_s", "replace_backoff_s",
                     "replace_backoff_max_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SupervisorConfig.{name} must be positive, got {getattr(self, name)}")
        if self.max_restarts_per_window < 0:
            raise ValueError(f"SupervisorConfig.max_restarts_per_window must be >= 0, "
                             f"got {self.max_restarts_per_window}")


@dataclass(slots=True)
class ReplicaHandle:
    """What serve knows about one replica."""

    replica_id: str
    actor: ActorHandle
    """The replica's Ray actor."""
    role: Role = "both"
    """prefill, decode or both (cluster/config/roles.py); the router is told it at registration."""
    endpoints: ReplicaEndpoints | None = None
    """Last answer of ``actor.endpoints()`` (None until ready, and after the replica was removed)."""
    up: bool = False
    restarts_seen: int = 0
    """Restarts seen over the replica's life (Ray's and replacements)."""
    replacements: int = 0
    """Times a dead actor was replaced by a new one."""
    restart_times: deque = field(default_factory=deque)
    """``time.monotonic()`` of each restart within the window."""
    replace_at: float | None = None
    """When the pending replacement of a dead actor is due (None: none pending)."""
    deployment: str = ""
    """The deployment it serves (its served model name, ``deployments.models``); "" in a one-model cluster."""


def replica_index(replica_id: str) -> int:
    """The index in a serve replica's name (``replica-3``, ``prefill-4`` -> 3, 4)."""
    return int(replica_id.rsplit("-", 1)[1])


def register(router: RouterClient, handle: ReplicaHandle) -> None:
    e: ReplicaEndpoints = handle.endpoints or {}
    router.register(handle.replica_id, e["http_url"], e.get("events_endpoint"), e.get("replay_endpoint"),
                    role=handle.role)


def _incarnation(endpoints: ReplicaEndpoints | None) -> tuple[int | str | float | None, ...]:
    e: ReplicaEndpoints = endpoints or {}
    return e.get("pid"), e.get("http_url"), e.get("events_endpoint"), e.get("started_at")


def actor_state(actor: ActorHandle) -> str:
    """ALIVE, RESTARTING, DEAD, ... from the GCS (no dashboard needed); UNKNOWN if it cannot tell."""
    try:
        import ray

        info = ray._private.state.state.actor_table(actor._actor_id.hex())
        return str(info.get("State", "UNKNOWN")) if info else "UNKNOWN"
    except Exception:  # private API: degrade to "unknown" rather than fail the supervisor
        return "UNKNOWN"


class Supervisor:
    """Background thread: watches replica actors, replaces dead ones, updates the router."""

    def __init__(self, replicas: list[ReplicaHandle], router: RouterClient, interval_s: float | None = None,
                 call_timeout_s: float | None = None, report: Callable[[str], None] = print,
                 spawn: Callable[[str], ActorHandle] | None = None, config: SupervisorConfig | None = None) -> None:
        config = config or SupervisorConfig()
        self.config = config
        self.replicas = replicas
        self.router = router
        self.interval_s = interval_s if interval_s is not None else config.interval_s
        self.call_timeout_s = call_timeout_s if call_timeout_s is not None else config.call_timeout_s
        self.report = report
        self.spawn = spawn
        """Makes a new replica actor for a replica id (None: dead replicas are deregistered)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvmesh-supervisor", daemon=True)

    def start(self) -> Supervisor:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.call_timeout_s + self.interval_s + 1)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            for handle in self.replicas:
                if self._stop.is_set():
                    return
                try:
                    self.check(handle)
                except Exception as e:  # never let the supervisor die
                    logger.warning("supervising %s failed: %s", handle.replica_id, e)

    def check(self, handle: ReplicaHandle) -> None:
        """One look at one replica (also called directly by tests)."""
        import ray

        if handle.replace_at is not None:
            self._replace_when_due(handle)
            return
        try:
            endpoints = ray.get(handle.actor.endpoints.remote(), timeout=self.call_timeout_s)
        except Exception as e:
            self._down(handle, e)
            return
        if _incarnation(endpoints) != _incarnation(handle.endpoints):
            restarted = handle.endpoints is not None
            handle.endpoints = endpoints
            register(self.router, handle)
            if restarted:
                self._count_restart(handle)
                self.report(f"{handle.replica_id} is back at {endpoints['http_url']} (restarted, "
                            "empty cache); the router re-registered it")
        elif not handle.up:
            self.report(f"{handle.replica_id} answers again at {endpoints['http_url']}")
        handle.up = True

    def recent_restarts(self, handle: ReplicaHandle) -> int:
        """Restarts of ``handle`` within the sliding window."""
        horizon = time.monotonic() - self.config.restart_window_s
        while handle.restart_times and handle.restart_times[0] < horizon:
            handle.restart_times.popleft()
        return len(handle.restart_times)

    def _count_restart(self, handle: ReplicaHandle) -> None:
        handle.restarts_seen += 1
        handle.restart_times.append(time.monotonic())

    def replace_delay(self, handle: ReplicaHandle) -> float:
        """Seconds to wait before replacing ``handle`` now (0 within the window's allowance)."""
        cfg = self.config
        extra = self.recent_restarts(handle) - cfg.max_restarts_per_window
        if extra <= 0:
            return 0.0
        return min(cfg.replace_backoff_max_s, cfg.replace_backoff_s * 2 ** (extra - 1))

    def _down(self, handle: ReplicaHandle, error: Exception) -> None:
        state = actor_state(handle.actor)
        if handle.up:
            self.report(f"{handle.replica_id} is down ({type(error).__name__}); the router routes around "
                        f"it{'; Ray is restarting it' if state != 'DEAD' else ''}")
        handle.up = False
        if state != "DEAD":
            return
        if self.spawn is None:
            if handle.endpoints is not None:
                self.report(f"{handle.replica_id} is dead and Ray will not restart it; removed from the router")
                self.router.deregister(handle.replica_id)
                handle.endpoints = None
            return
        self._count_restart(handle)
        delay = self.replace_delay(handle)
        handle.replace_at = time.monotonic() + delay
        self.report(f"{handle.replica_id} is dead and Ray will not restart it; replacing it"
                    + (f" in {delay:.0f}s ({self.recent_restarts(handle)} restarts within "
                       f"{self.config.restart_window_s:.0f}s)" if delay else ""))
        self._replace_when_due(handle)

    def _replace_when_due(self, handle: ReplicaHandle) -> None:
        if handle.replace_at is None or time.monotonic() < handle.replace_at:
            return
        import ray

        try:
            ray.kill(handle.actor, no_restart=True)  # gone already; make sure its name is free
        except Exception:  # noqa: BLE001 - a dead actor may refuse; nothing to do then
            pass
        handle.actor = self.spawn(handle.replica_id)
        handle.replacements += 1
        handle.replace_at = None
        self.report(f"{handle.replica_id}: started a replacement actor (replacement {handle.replacements})")
