"""Admission's metrics, per tenant and priority class (``kvmesh_router_admission_*`` on the router's /metrics).

    admission_queued{tenant,priority}           requests that had to wait in the router's queue
    admission_waiting{tenant,priority}          waiting now (gauge)
    admission_admitted{tenant,priority}         requests sent on to a replica
    admission_shed{tenant,priority,reason}      429s: queue_full, tenant_over_limit, deadline_unreachable
    admission_ttft_seconds{tenant,priority}     streamed requests: arrival at the router -> first bytes, queue included
    admission_queue_seconds{priority}           time spent waiting in the router (0 for those let go at once)
    admission_tokens{tenant,kind}               prompt (as sent), computed (prompt not found cached), output

Label values are bounded whatever tenants send: ``priority`` is the request's class, the largest key of
``admission.ttft_deadline_s`` at or below its priority (the smallest key below them all; ``ALL`` without classes),
never the raw value; ``tenant`` names the ``admission.metric_tenants`` tenants with the most tokens (their first
``TENANT_LABEL_CHARS`` characters) and sums the rest under ``OTHER`` (tenant_families.py). With ``router.workers`` > 1
each worker answers for itself, as for every
other router metric.
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

from kvmesh.replica.serving.metric_buckets import TTFT_BUCKETS
from kvmesh.router.admission.decisions import SHED_REASONS
from kvmesh.router.http.loop_histogram import LoopHistogram
from kvmesh.router.http.tenant_families import OTHER, TenantBook, TenantFamily

if TYPE_CHECKING:
    from kvmesh.router.admission.config import AdmissionConfig
    from prometheus_client import CollectorRegistry

__all__ = ["ALL", "OTHER", "AdmissionMetrics", "priority_class"]

ALL = "all"
"""The priority label of every request when no deadline classes are configured."""
TENANT_LABEL_CHARS = 64
"""Most characters of a tenant's name in its label (a ``user`` may be any length; longer names are cut)."""
_QUEUE_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


def priority_class(classes: list[int], priority: int) -> str:
    """The label of ``priority``: the largest of the sorted ``classes`` at or below it, else the smallest;
    ``ALL`` without classes (the class ``AdmissionConfig.class_deadline_s`` takes the deadline of)."""
    if not classes:
        return ALL
    at = bisect.bisect_right(classes, priority)
    return str(classes[at - 1] if at else classes[0])


class AdmissionMetrics:
    """The metrics above on ``registry``."""

    def __init__(self, registry: CollectorRegistry, config: AdmissionConfig) -> None:
        r = registry
        self.classes = sorted(config.ttft_deadline_s)
        self.book = book = TenantBook(r, config.metric_tenants, config.max_tenants)
        tp = ["tenant", "priority"]
        self.queued = TenantFamily(book, "kvmesh_router_admission_queued", "Requests that waited in the router's "
                                   "queue", tp, "counter")
        self.waiting = TenantFamily(book, "kvmesh_router_admission_waiting", "Requests waiting in the router's "
                                    "queue now", tp, "gauge")
        self.admitted = TenantFamily(book, "kvmesh_router_admission_admitted", "Requests the router sent on to a "
                                     "replica", tp, "counter")
        self.shed = TenantFamily(book, "kvmesh_router_admission_shed", "Requests answered 429 by admission, per "
                                 "reason (queue_full, tenant_over_limit, deadline_unreachable)", [*tp, "reason"],
                                 "counter")
        self.tokens = TenantFamily(book, "kvmesh_router_admission_tokens", "Tokens per tenant: prompt (as sent), "
                                   "computed (prompt tokens not found cached), output", ["tenant", "kind"], "counter")
        self.ttft = TenantFamily(book, "kvmesh_router_admission_ttft_seconds", "Streamed requests: arrival at the "
                                 "router to the replica's first bytes, time in the router's queue included", tp,
                                 "histogram", TTFT_BUCKETS)
        book.usage = self.tokens
        self.queue_seconds = LoopHistogram("kvmesh_router_admission_queue_seconds",
                                           "Seconds requests waited in the router's queue", ["priority"],
                                           _QUEUE_BUCKETS, r)

    def tenant(self, name: str) -> str:
        """The tenant label of ``name`` as it is counted (the scrape decides whether it is shown by name)."""
        return name[:TENANT_LABEL_CHARS]

    def labels(self, tenant: str, priority: int) -> tuple[str, str]:
        """The labels of a request of ``tenant`` and ``priority``; a pair's counters are made at 0 when it is first
        seen (so rates and dashboards see a series before its first queue or 429)."""
        labels = tenant[:TENANT_LABEL_CHARS], priority_class(self.classes, priority)
        if labels not in self.admitted.cells:
            for family in (self.queued, self.waiting, self.admitted):
                family.labels(*labels)
            for reason in SHED_REASONS:
                self.shed.labels(*labels, reason)
        return labels
