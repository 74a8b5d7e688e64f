"""`kvmesh status`'s tenants table reads the router's admission metrics (cluster/tenant_status.py)."""

from __future__ import annotations

from kvmesh.cluster.tenant_status import format_tenants, tenant_rows
from kvmesh.router.admission.config import AdmissionConfig
from kvmesh.router.http.admission_metrics import OTHER, AdmissionMetrics
from prometheus_client import CollectorRegistry, generate_latest


def _text(metrics: AdmissionMetrics, registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()


def test_rows_per_tenant_and_priority_with_shed_reasons_ttft_and_tokens():
    registry = CollectorRegistry()
    m = AdmissionMetrics(registry, AdmissionConfig())
    m.admitted.labels("flood", "0").inc(40)
    m.queued.labels("flood", "0").inc(30)
    m.waiting.labels("flood", "0").inc(3)
    m.shed.labels("flood", "0", "queue_full").inc(5)
    m.shed.labels("flood", "0", "tenant_over_limit").inc(2)
    m.admitted.labels("light", "-1").inc(2)
    m.ttft.labels("light", "-1").observe(0.1)
    m.ttft.labels("light", "-1").observe(0.3)
    m.tokens.labels("flood", "prompt").inc(1000)
    m.tokens.labels("flood", "output").inc(64)
    rows = tenant_rows(_text(m, registry))
    assert [(r.tenant, r.priority) for r in rows] == [("flood", "0"), ("light", "-1")]
    flood, light = rows
    assert (flood.admitted, flood.queued, flood.waiting) == (40, 30, 3)
    assert flood.shed == {"queue_full": 5, "tenant_over_limit": 2}
    assert light.ttft_avg_s == 0.2 and light.tokens == {}
    table = format_tenants(rows)
    assert "5/2/0" in table and "200 ms" in table and "1000/0/64" in table
    assert format_tenants(tenant_rows("")) == ""


def test_tenant_labels_are_bounded():
    registry = CollectorRegistry()
    m = AdmissionMetrics(registry, AdmissionConfig(metric_tenants=2))
    for tokens, tenant in enumerate("abc"):
        m.admitted.labels(*m.labels(tenant, 0)).inc()
        m.tokens.labels(tenant, "prompt").inc(tokens)
    assert sorted(r.tenant for r in tenant_rows(_text(m, registry))) == [OTHER, "b", "c"]  # the two busiest
