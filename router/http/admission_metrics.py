"""Admission's metrics, per tenant and priority (``kvmesh_router_admission_*`` on the router's /metrics).

    admission_queued{tenant,priority}           requests that had to wait in the router's queue
    admission_waiting{tenant,priority}          waiting now (gauge)
    admission_admitted{tenant,priority}         requests sent on to a replica
    admission_shed{tenant,priority,reason}      429s: queue_full, tenant_over_limit, deadline_unreachable
    admission_ttft_seconds{tenant,priority}     streamed requests: arrival at the router -> first bytes, queue included
    admission_queue_seconds{priority}           time spent waiting in the router (0 for those let go at once)
    admission_tokens{tenant,kind}               prompt (as sent), computed (prompt not found cached), output

Label values are bounded: past ``max_labels`` tenants (or priorities), the rest count under ``OTHER`` (a ``user``
field can name any number of tenants). With ``router.workers`` > 1 each worker answers for itself, as for every
other router metric.
"""

from __future__ import annotations

from kvmesh.replica.serving.metric_buckets import TTFT_BUCKETS
from kvmesh.router.admission.decisions import SHED_REASONS
from kvmesh.router.http.loop_histogram import LoopHistogram
from prometheus_client import CollectorRegistry, Counter, Gauge

OTHER = "*other*"
"""The label of tenants or priorities past the bound."""
_QUEUE_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class _Bounded:
    """At most ``limit`` distinct label values; later ones map to ``OTHER``."""

    def __init__(self, limit: int) -> None:
        self.limit, self.seen = limit, set()

    def __call__(self, value: str) -> str:
        if value in self.seen:
            return value
        if len(self.seen) >= self.limit:
            return OTHER
        self.seen.add(value)
        return value


class AdmissionMetrics:
    """The counters above on ``registry``."""

    def __init__(self, registry: CollectorRegistry, max_labels: int = 1024, max_priorities: int = 64) -> None:
        r = registry
        self.tenant, self.priority = _Bounded(max_labels), _Bounded(max_priorities)
        self._seen: set[tuple[str, str]] = set()
        tp = ["tenant", "priority"]
        self.queued = Counter("kvmesh_router_admission_queued", "Requests that waited in the router's queue", tp,
                              registry=r)
        self.waiting = Gauge("kvmesh_router_admission_waiting", "Requests waiting in the router's queue now", tp,
                             registry=r)
        self.admitted = Counter("kvmesh_router_admission_admitted", "Requests the router sent on to a replica", tp,
                                registry=r)
        self.shed = Counter("kvmesh_router_admission_shed", "Requests answered 429 by admission, per reason "
                            "(queue_full, tenant_over_limit, deadline_unreachable)", [*tp, "reason"], registry=r)
        self.tokens = Counter("kvmesh_router_admission_tokens", "Tokens per tenant: prompt (as sent), computed "
                              "(prompt tokens not found cached), output", ["tenant", "kind"], registry=r)
        self.ttft = LoopHistogram("kvmesh_router_admission_ttft_seconds", "Streamed requests: arrival at the "
                                  "router to the replica's first bytes, time in the router's queue included", tp,
                                  TTFT_BUCKETS, r)
        self.queue_seconds = LoopHistogram("kvmesh_router_admission_queue_seconds",
                                           "Seconds requests waited in the router's queue", ["priority"],
                                           _QUEUE_BUCKETS, r)

    def labels(self, tenant: str, priority: int) -> tuple[str, str]:
        """The (bounded) labels of a request of ``tenant`` and ``priority``; a pair's counters are made at 0 when
        it is first seen (so rates and dashboards see a series before its first queue or 429)."""
        labels = self.tenant(tenant), self.priority(str(priority))
        if labels not in self._seen:
            self._seen.add(labels)
            for metric in (self.queued, self.waiting, self.admitted):
                metric.labels(*labels)
            for reason in SHED_REASONS:
                self.shed.labels(*labels, reason)
        return labels
