"""What a failed attempt on a replica means for it: counted towards its ejection (router/routing/outlier.py), or not.

A refused or reset connection counts, and marks the replica unhealthy until its next ``/health`` probe. A missed
deadline while the replica showed no progress (router/http/patience.py) and an answer that is not JSON or SSE
are *sick* answers: a replica that answers ``/health`` can still give them, so they eject it until a probe
request is answered (router/routing/outlier.py). A deadline missed while the replica was working moves the
request without counting: the replica is slow, not sick. Each failure is a sample of
``kvmesh_router_replica_failures_total{kind}``, and the route receipt names it (``failed_over``).

What the request caused is never the replica's failure: a 4xx answer, and a stream's error event whose ``code`` is a
4xx (``request_error_event``: a replica that found the request's fault after the stream began), go to the client as
they are, without a retry, a migration or a count; so does a stream whose choice ends with ``finish_reason:
"error"`` (a constraint the replica could not go on with). A 5xx is the replica's.
"""

from __future__ import annotations

import re
from typing import Protocol

from kvmesh.router.http.upstream import DeadlineMissed, UpstreamConnectError

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
    """What counting a failure needs of the running router (``RouterRuntime.mark_failed``)."""

    def mark_failed(self, replica_id: str, connect_error: bool, why: str = ..., kind: str | None = ...,
                    sick: bool = ...) -> None: ...


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
