"""What a failed attempt on a replica means for it: counted towards its ejection (router/routing/outlier.py), or not.

A refused or reset connection counts, and marks the replica unhealthy until its next ``/health`` probe. A missed
deadline while the replica showed no progress (router/replicas/patience.py) and an answer that is not JSON or SSE
are *sick* answers: a replica that answers ``/health`` can still give them, so they eject it until a probe
request is answered (router/routing/outlier.py). A deadline missed while the replica was working moves the
request without counting: the replica is slow, not sick. Each failure is a sample of
``kvmesh_router_replica_failures_total{kind}``, and the route receipt names it (``failed_over``).

What the request caused is never the replica's failure: a 4xx answer, and a stream's error event whose ``code`` is a
4xx (``request_error_event``: a replica that found the request's fault after the stream began), go to the client as
they are, without a retry, a migration or a count; so does a stream whose choice ends with ``finish_reason:
"error"`` (a constraint the replica could not go on with). A 5xx is the replica's, unless every replica a
request went to answered it so (``settle_5xx``): a request that fails everywhere is the fault.
"""

from __future__ import annotations

import logging
import re
from typing import Protocol

from kvmesh.router.http.upstream import DeadlineMissed, UpstreamConnectError

logger = logging.getLogger(__name__)
_ERROR_CODE = re.compile(rb'"code"\s*:\s*"?(\d{3})\b')


def caused_by_request(status: int) -> bool:
    """Whether an answer with HTTP ``status`` (or an error event with that ``code``) is the request's fault, not the
    replica's: a 4xx."""
    return 400 <= status < 500


def request_error_event(event: bytes) -> bool:
    """Whether an SSE error event (``data: {"error": {..., "code": 400}}``) names a 4xx: the request's fault."""
    found = _ERROR_CODE.search(event)
    return found is not None and caused_by_request(int(found.group(1)))


class FailedReplicas(Protocol):
    """What counting a failure needs of the running router (``RouterRuntime.mark_failed``, ``record_failure``)."""

    def mark_failed(self, replica_id: str, connect_error: bool, why: str = ..., kind: str | None = ...,
                    sick: bool = ...) -> None: ...
    def record_failure(self, replica_id: str, why: str, kind: str, sick: bool = ...) -> None: ...


def settle_5xx(runtime: FailedReplicas, held: list[tuple[str, int]], answered_elsewhere: bool) -> None:
    """Count the 5xx answers one request got before its first byte (``held``: replica, status; emptied), now that
    its attempts are over or another replica answered it: each counts against its replica, unless two replicas
    or more answered it 5xx and none otherwise -- then the request is what fails (a poison request), logged,
    not counted."""
    replicas = {rid for rid, _ in held}
    if not answered_elsewhere and len(replicas) >= 2:
        logger.warning("replicas %s all answered one request with a 5xx: the request's fault, not counted against "
                       "them", ", ".join(sorted(map(str, replicas))))
    else:
        for rid, status in held:
            runtime.record_failure(rid, f"answered HTTP {status}", "http_5xx")
    held.clear()


class InvalidAnswer(Exception):
    """A replica answered 200 with a body that is not JSON, or a stream event that is not SSE JSON: counted
    against it, the request tried elsewhere (or the stream moved)."""

    def __init__(self, message: str, kind: str = "invalid_json") -> None:
        super().__init__(message)
        self.kind = kind
        """``invalid_json`` or ``invalid_sse`` (the failure metric's label)."""


class BrokenAnswer(Exception):
    """A replica's whole (not streamed) answer broke off before its end (``error``): nothing reached the
    client, so the request is tried on another replica, and ``error`` counted against this one."""

    def __init__(self, error: BaseException) -> None:
        super().__init__("failed while answering")
        self.error = error


def count_failure(runtime: FailedReplicas, replica_id: str, error: BaseException) -> str:
    """Count a failed attempt against its replica (a missed deadline only if the replica showed no progress);
    what went wrong, for the route receipt."""
    if isinstance(error, DeadlineMissed):
        kind = "first_byte_deadline" if error.first_byte else "stream_idle_deadline"
        if not error.progressed:
            runtime.mark_failed(replica_id, False, f"missed a deadline: {error}", kind, sick=True)
        return kind
    if isinstance(error, InvalidAnswer):
        runtime.mark_failed(replica_id, False, str(error), error.kind, sick=True)
        return error.kind
    connect = isinstance(error, UpstreamConnectError)
    runtime.mark_failed(replica_id, connect, f"failed: {error}", "connect" if connect else "reset")
    return "connect" if connect else "reset"
