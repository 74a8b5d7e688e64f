"""Keeps the router's replica set in step with the replica actors Ray keeps alive.

Every ``interval_s`` the supervisor asks each replica actor for its endpoints:

    answer, same incarnation (pid, URL)      -> nothing to do
    answer, new incarnation (Ray restarted)  -> re-register with the router: it drops the replica's
                                                old prefix tree and subscribes to the new stream,
                                                whose first batch is AllBlocksCleared
    no answer (dead or restarting)           -> report once; the router already routes around it
                                                (failed /health probes); deregister only when Ray
                                                has given up on the actor (restarts exhausted)
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvmesh.cluster.router_client import RouterClient

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class ReplicaHandle:
    """What serve knows about one replica."""

    replica_id: str
    actor: Any
    endpoints: dict[str, Any] | None = None
    """Last answer of ``actor.endpoints()`` (None until ready)."""
    up: bool = False
    restarts_seen: int = 0


def register(router: RouterClient, handle: ReplicaHandle) -> None:
    e = handle.endpoints or {}
    router.register(handle.replica_id, e["http_url"], e.get("events_endpoint"), e.get("replay_endpoint"))


def _incarnation(endpoints: dict[str, Any] | None) -> tuple:
    e = endpoints or {}
    return e.get("pid"), e.get("http_url"), e.get("events_endpoint"), e.get("started_at")


def actor_state(actor: Any) -> str:
    """ALIVE, RESTARTING, DEAD, ... from the GCS (no dashboard needed); UNKNOWN if it cannot tell."""
    try:
        import ray

        info = ray._private.state.state.actor_table(actor._actor_id.hex())
        return str(info.get("State", "UNKNOWN")) if info else "UNKNOWN"
    except Exception:  # private API: degrade to "unknown" rather than fail the supervisor
        return "UNKNOWN"


class Supervisor:
    """Background thread: watches replica actors and updates the router's replica set."""

    def __init__(self, replicas: list[ReplicaHandle], router: RouterClient, interval_s: float = 1.0,
                 call_timeout_s: float = 5.0, report: Callable[[str], None] = print) -> None:
        self.replicas = replicas
        self.router = router
        self.interval_s = interval_s
        self.call_timeout_s = call_timeout_s
        self.report = report
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
                handle.restarts_seen += 1
                self.report(f"{handle.replica_id} is back at {endpoints['http_url']} (restarted by Ray, "
                            "empty cache); the router re-registered it")
        elif not handle.up:
            self.report(f"{handle.replica_id} answers again at {endpoints['http_url']}")
        handle.up = True

    def _down(self, handle: ReplicaHandle, error: Exception) -> None:
        state = actor_state(handle.actor)
        if handle.up:
            self.report(f"{handle.replica_id} is down ({type(error).__name__}); the router routes around "
                        f"it{'; Ray is restarting it' if state != 'DEAD' else ''}")
        handle.up = False
        if state == "DEAD" and handle.endpoints is not None:
            self.report(f"{handle.replica_id} is dead and Ray will not restart it (max_restarts reached); "
                        "removed from the router")
            self.router.deregister(handle.replica_id)
            handle.endpoints = None
