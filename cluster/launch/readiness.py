"""Waiting for a starting cluster: each replica ready and registered with the router, then the router
(and its worker processes) seeing every one of them healthy."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, TypeVar

import aiohttp
from kvmesh.cluster.launch.serve_router import RouterProcesses
from kvmesh.cluster.launch.supervisor import ReplicaHandle, register
from kvmesh.cluster.router_client import RouterClient

if TYPE_CHECKING:
    from kvmesh.router.control.router_server import RouterServer

NOTE_EVERY_S = 10.0
"""How often a long wait says how many replicas are still loading."""
RETRY_AFTER_S = 0.5
"""Pause before asking the router again when a start-up request went unanswered."""
T = TypeVar("T")


def wait_replicas_ready(replicas: list[ReplicaHandle], router_client: RouterClient, timeout_s: float,
                        report: Callable[[str], None], elapsed_s: Callable[[], float]) -> None:
    """Register each replica with the router as it becomes ready; raise when one fails or ``timeout_s`` passes."""
    import ray

    pending = {h.actor.ready.remote(): h for h in replicas}
    deadline = time.monotonic() + timeout_s
    last_note = time.monotonic()
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
        for ref in done:
            handle = pending.pop(ref)
            try:
                handle.endpoints = ray.get(ref)
            except Exception as e:
                raise RuntimeError(f"{handle.replica_id} failed to start: {first_line(e)}") from e
            handle.up = True
            until_answered(partial(register, router_client, handle), deadline, f"registering {handle.replica_id}")
            ready = len(replicas) - len(pending)
            report(f"{handle.replica_id} ready ({ready}/{len(replicas)}) at {handle.endpoints['http_url']}, "
                   f"events {handle.endpoints.get('events_endpoint')} [{elapsed_s():.1f}s]")
        now = time.monotonic()
        if pending and now - last_note >= NOTE_EVERY_S:
            last_note = now
            report(f"waiting for {len(pending)} replica(s) to load the model... [{elapsed_s():.0f}s]")
        if pending and now > deadline:
            raise TimeoutError(f"{len(pending)} replica(s) not ready after {timeout_s:.0f}s "
                               "(ray.ready_timeout_s); see the Ray logs (serve --verbose shows them)")


def wait_router_sees(router_client: RouterClient, router: RouterServer | RouterProcesses, want: int,
                     timeout_s: float = 30.0) -> None:
    """Until the router reports ``want`` healthy replicas (and its worker processes follow it)."""
    deadline = time.monotonic() + timeout_s
    healthy: list[str] = []
    while time.monotonic() < deadline:
        healthy = until_answered(router_client.health, deadline, "asking the router's health").get(
            "healthy_replicas", [])
        if len(healthy) >= want:
            if isinstance(router, RouterProcesses):  # several router processes follow it
                router.wait_workers_see(want, max(deadline - time.monotonic(), 1.0))
            return
        time.sleep(0.1)
    raise TimeoutError(f"the router sees {len(healthy)} of {want} replicas healthy after {timeout_s:.0f}s")


def until_answered(call: Callable[[], T], deadline: float, what: str) -> T:
    """``call()`` (a request to the router in this process), asked again while it times out or cannot connect: a
    loaded machine can leave one request unanswered for seconds; past ``deadline`` the last error is raised,
    saying what was being done."""
    while True:
        try:
            return call()
        except (TimeoutError, aiohttp.ClientConnectionError) as e:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: {e}") from e
            time.sleep(RETRY_AFTER_S)


def first_line(e: BaseException) -> str:
    """The line of a (Ray-wrapped) exception that says what went wrong."""
    text = str(e).strip().splitlines()
    interesting = [line for line in text if "Error" in line and not line.startswith(" ")]
    return (interesting[-1] if interesting else (text[0] if text else type(e).__name__))[:500]
