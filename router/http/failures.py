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
from typing import TYPE_CHECKING

from kvmesh.router.http.upstream import DeadlineMissed, UpstreamConnectError
from kvmesh.router.replicas.patience import Patience
from kvmesh.router.routing.outlier import OutlierDetector

if TYPE_CHECKING:
    from kvmesh.router.config import RouterConfig
    from kvmesh.router.http.metrics import RouterMetrics
    from kvmesh.router.replicas.replica import Replica
    from kvmesh.router.routing.kv_router import KVRouter

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


class ReplicaFailures:
    """What the answers say of each replica (Envoy's outlier detection; the bookkeeping is router/routing/outlier.py,
    the deadlines router/replicas/patience.py): every failed answer counted, a sick one or enough in a row eject
    the replica -- never the last one in rotation. Its polls and probe requests are
    router/control/passive_health.py's."""

    def __init__(self, config: RouterConfig, router: KVRouter, metrics: RouterMetrics) -> None:
        self.upstream, self.router, self.metrics = config.upstream, router, metrics
        self.replicas = router.replicas
        self.outliers = OutlierDetector(config.outliers)

    def patience(self, replica: Replica) -> Patience | None:
        """The deadlines of the replica's answers (router/replicas/patience.py); None: none configured."""
        cfg = self.upstream
        if cfg.first_byte_timeout_s is None and cfg.stream_idle_timeout_s is None:
            return None
        if replica.removed:  # removed meanwhile: the deadlines stand, kept nowhere
            return Patience(cfg.first_byte_timeout_s, cfg.stream_idle_timeout_s, lambda since: False)
        if replica.patience is None:
            outliers = self.outliers
            replica.patience = Patience(cfg.first_byte_timeout_s, cfg.stream_idle_timeout_s,
                                        lambda since: outliers.progressed_since(replica, since))
        return replica.patience

    def record_failure(self, replica: Replica, why: str, kind: str, sick: bool = False) -> None:
        """Count a failure of the replica (``kind`` labels the metric); a ``sick`` one (its /health cannot vouch
        for it) or enough in a row eject it, unless no other replica would be left in rotation."""
        if replica.removed:
            return
        self.metrics.child(self.metrics.replica_failures, replica.id, kind).inc()
        others = any(r is not replica and r.healthy and r.health.ejected_until is None for r in self.replicas)
        seconds = self.outliers.on_failure(replica, why, can_eject=others, sick=sick)
        if seconds is not None:
            self.eject(replica, seconds)

    def eject(self, replica: Replica, seconds: float) -> None:
        h = replica.health
        logger.warning("replica %s ejected %s after %d failure(s) in a row (last: %s)", replica.id,
                       f"for {seconds:.0f}s, then until a probe request is answered" if seconds else
                       "until a probe request is answered", h.consecutive_failures, h.last_failure)
        self.metrics.child(self.metrics.ejections, replica.id).inc()
        self.router.set_healthy(replica, False)

    def mark_failed(self, replica: Replica, connect_error: bool, why: str = "failed", kind: str | None = "connect",
                    sick: bool = False) -> None:
        """A request to the replica failed (or, ``kind`` None, its /health probe, which is not counted): stop
        routing to it until a probe succeeds, and count the failure (``record_failure``). A refused connection
        means the process is gone and its cache with it: drop its tree."""
        if replica.healthy and not sick and not replica.removed:
            logger.warning("replica %s %s; routing around it until it answers /health", replica.id, why)
        self.router.set_healthy(replica, False, clear_cache=connect_error)
        if kind is not None:
            self.record_failure(replica, why, kind, sick)


def settle_5xx(failures: ReplicaFailures, held: list[tuple[Replica, int]], answered_elsewhere: bool) -> None:
    """Count the 5xx answers one request got before its first byte (``held``: replica, status; emptied), now that
    its attempts are over or another replica answered it: each counts against its replica, unless two replicas
    or more answered it 5xx and none otherwise -- then the request is what fails (a poison request), logged,
    not counted."""
    if not held:  # the usual case: none
        return
    replicas = {replica.id for replica, _ in held}
    if not answered_elsewhere and len(replicas) >= 2:
        logger.warning("replicas %s all answered one request with a 5xx: the request's fault, not counted against "
                       "them", ", ".join(sorted(map(str, replicas))))
    else:
        for replica, status in held:
            failures.record_failure(replica, f"answered HTTP {status}", "http_5xx")
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


def count_failure(failures: ReplicaFailures, replica: Replica, error: BaseException) -> str:
    """Count a failed attempt against its replica (a missed deadline only if the replica showed no progress);
    what went wrong, for the route receipt."""
    if isinstance(error, DeadlineMissed):
        kind = "first_byte_deadline" if error.first_byte else "stream_idle_deadline"
        if not error.progressed:
            failures.mark_failed(replica, False, f"missed a deadline: {error}", kind, sick=True)
        return kind
    if isinstance(error, InvalidAnswer):
        failures.mark_failed(replica, False, str(error), error.kind, sick=True)
        return error.kind
    connect = isinstance(error, UpstreamConnectError)
    failures.mark_failed(replica, connect, f"failed: {error}", "connect" if connect else "reset")
    return "connect" if connect else "reset"
