"""The tenants table of ``kvmesh status``: admission per tenant and priority, read from the router's /metrics
(``kvmesh_router_admission_*``, router/http/admission_metrics.py).

    TENANT  PRIO  WAITING  QUEUED  ADMITTED  SHED full/limit/deadline  TTFT avg  TOKENS prompt/computed/output

With ``router.workers`` > 1 the numbers are those of the worker that answered /metrics, as for every router metric.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SHED_REASONS = ("queue_full", "tenant_over_limit", "deadline_unreachable")
"""router/admission/decisions.py's reasons, in the SHED column's order."""
_COUNTS = {"kvmesh_router_admission_waiting": "waiting", "kvmesh_router_admission_queued_total": "queued",
           "kvmesh_router_admission_admitted_total": "admitted"}
_READ = {*_COUNTS, "kvmesh_router_admission_shed_total", "kvmesh_router_admission_tokens_total",
         "kvmesh_router_admission_ttft_seconds_sum", "kvmesh_router_admission_ttft_seconds_count"}


@dataclass(slots=True)
class TenantStatus:
    """One (tenant, priority) row."""

    tenant: str
    priority: str
    waiting: int = 0
    """Waiting in the router's queue now."""
    queued: int = 0
    """Requests that had to wait."""
    admitted: int = 0
    """Requests sent on to a replica."""
    shed: dict[str, int] = field(default_factory=dict)
    """429s by reason."""
    ttft_sum_s: float = 0.0
    ttft_count: int = 0
    """Streamed requests' time to first token, queue included: sum and count."""
    tokens: dict[str, int] = field(default_factory=dict)
    """The tenant's tokens by kind (prompt, computed, output), on its first row."""

    @property
    def ttft_avg_s(self) -> float | None:
        return self.ttft_sum_s / self.ttft_count if self.ttft_count else None


def tenant_rows(text: str) -> list[TenantStatus]:
    """The rows of the router's Prometheus ``text`` (none when it has no admission metrics)."""
    from prometheus_client.parser import text_string_to_metric_families

    rows: dict[tuple[str, str], TenantStatus] = {}
    tokens: dict[str, dict[str, int]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name, labels = sample.name, sample.labels
            if name not in _READ or "tenant" not in labels:  # e.g. the counters' _created samples
                continue
            if name == "kvmesh_router_admission_tokens_total":
                tokens.setdefault(labels["tenant"], {})[labels["kind"]] = int(sample.value)
                continue
            key = (labels["tenant"], labels.get("priority", ""))
            row = rows.get(key) or rows.setdefault(key, TenantStatus(*key))
            if name in _COUNTS:
                setattr(row, _COUNTS[name], int(sample.value))
            elif name == "kvmesh_router_admission_shed_total":
                row.shed[labels["reason"]] = int(sample.value)
            elif name == "kvmesh_router_admission_ttft_seconds_sum":
                row.ttft_sum_s = sample.value
            elif name == "kvmesh_router_admission_ttft_seconds_count":
                row.ttft_count = int(sample.value)
    ordered = sorted(rows.values(), key=lambda r: (r.tenant, _as_int(r.priority)))
    seen: set[str] = set()
    for row in ordered:
        if row.tenant not in seen:
            seen.add(row.tenant)
            row.tokens = tokens.get(row.tenant, {})
    return ordered


def format_tenants(rows: list[TenantStatus]) -> str:
    """The table (empty string: no rows)."""
    if not rows:
        return ""
    header = ("TENANT", "PRIO", "WAITING", "QUEUED", "ADMITTED", "SHED full/limit/deadline", "TTFT avg",
              "TOKENS prompt/computed/output")
    lines = [header]
    for r in rows:
        shed = "/".join(str(r.shed.get(reason, 0)) for reason in SHED_REASONS)
        ttft = "-" if r.ttft_avg_s is None else f"{r.ttft_avg_s * 1e3:.0f} ms"
        tokens = "/".join(str(r.tokens.get(kind, 0)) for kind in ("prompt", "computed", "output")) if r.tokens else ""
        lines.append((r.tenant, r.priority, str(r.waiting), str(r.queued), str(r.admitted), shed, ttft, tokens))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
                     for line in lines)


def _as_int(text: str) -> tuple[int, str]:
    try:
        return int(text), ""
    except ValueError:
        return 1 << 62, text
