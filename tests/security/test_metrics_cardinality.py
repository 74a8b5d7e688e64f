"""A tenant cannot inflate the router's /metrics: every new (tenant, priority) pair used to add ~1.2 KB (74 KB ->
5.3 MB after 4,500 requests, bounded only near 75 MB, a raw ``priority: 10**100`` a label of its own).

Priority labels are the configured deadline classes, tenant labels the ``metric_tenants`` busiest tenants and
``*other*`` (router/http/admission_metrics.py, tenant_families.py). The flood of 10,000 identities x 100
priorities goes through the metrics objects (a live router would take minutes for a million requests); a live
router in front of a fake replica checks the same labels on a smaller flood.
"""

from __future__ import annotations

import time

import httpx
import pytest
from kvmesh.replica.serving.tokenizer import load_tokenizer
from kvmesh.router.admission.config import AdmissionConfig
from kvmesh.router.config import RouterConfig, UpstreamConfig
from kvmesh.router.control.router_server import RouterServer
from kvmesh.router.http.admission_metrics import ALL, OTHER, AdmissionMetrics
from kvmesh.router.http.metrics import RouterMetrics
from prometheus_client.parser import text_string_to_metric_families

from ..router.conftest import launched_fakes, wait_for

IDENTITIES, PRIORITIES = 10_000, 100
CLASSES = {0: 1.0, 10: 5.0, 50: 30.0}
"""Deadline classes: the only priority labels there may be."""
BYTES_PER_TENANT_CLASS = 4096
"""Most bytes one named tenant in one priority class adds to /metrics (every counter, the TTFT histogram and its
tokens; README, Metrics): (metric_tenants + 1) x classes x this bounds the admission metrics."""
FLOOD_BYTES = (32 + 1) * len(CLASSES) * BYTES_PER_TENANT_CLASS


def admission_samples(text: str) -> list:
    return [s for family in text_string_to_metric_families(text) for s in family.samples
            if s.name.startswith("kvmesh_router_admission_")]


def flood(metrics: AdmissionMetrics, identities: int, priorities: int) -> None:
    """Each identity asks every priority once (admitted), then sheds one and streams one; its tokens grow with i."""
    for i in range(identities):
        tenant = f"identity-{i}"
        for p in range(priorities):
            labels = metrics.labels(tenant, p - priorities // 4)
            metrics.admitted.labels(*labels).inc()
        metrics.tokens.labels(tenant, "prompt").inc(i)
        metrics.shed.labels(*labels, "queue_full").inc()
        metrics.ttft.labels(*labels).observe(0.05)


def test_ten_thousand_identities_times_a_hundred_priorities_keep_metrics_small(record):
    router_metrics = RouterMetrics()
    admission = AdmissionMetrics(router_metrics.registry, AdmissionConfig(ttft_deadline_s=CLASSES))
    empty = len(router_metrics.render())
    t0 = time.perf_counter()
    flood(admission, IDENTITIES, PRIORITIES)
    flooded_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    text = router_metrics.render().decode()
    scrape_s = time.perf_counter() - t0
    added = len(text) - empty
    samples = admission_samples(text)
    tenants = {s.labels["tenant"] for s in samples if "tenant" in s.labels}
    priorities = {s.labels["priority"] for s in samples if "priority" in s.labels}
    record("10,000 identities x 100 priorities", added_bytes=added, scrape_s=round(scrape_s, 3),
           flood_s=round(flooded_s, 1), tenant_labels=len(tenants), priority_labels=len(priorities))
    assert added < FLOOD_BYTES, f"/metrics grew by {added} bytes"
    assert priorities == {"0", "10", "50"}, priorities
    assert OTHER in tenants and len(tenants) == 32 + 1, len(tenants)
    busiest = {f"identity-{i}" for i in range(IDENTITIES - 32, IDENTITIES)}
    assert tenants - {OTHER} == busiest  # the most tokens keep their names
    admitted = sum(s.value for s in samples if s.name == "kvmesh_router_admission_admitted_total")
    assert admitted == IDENTITIES * PRIORITIES  # nothing lost in the folding


def test_a_huge_priority_is_counted_in_its_class_and_without_classes_there_is_one_label():
    classes = AdmissionMetrics(RouterMetrics().registry, AdmissionConfig(ttft_deadline_s=CLASSES))
    assert classes.labels("t", 10**100)[1] == "50"
    assert classes.labels("t", -10**100)[1] == "0"
    assert classes.labels("t", 12)[1] == "10"
    plain = AdmissionMetrics(RouterMetrics().registry, AdmissionConfig())
    assert {plain.labels("t", p)[1] for p in (-10**28, -1, 0, 7, 10**100)} == {ALL}


def test_a_tenant_climbing_into_the_named_ones_keeps_counters_monotonic():
    router_metrics = RouterMetrics()
    admission = AdmissionMetrics(router_metrics.registry, AdmissionConfig(metric_tenants=1))

    def admitted() -> dict[str, float]:
        return {s.labels["tenant"]: s.value for s in admission_samples(router_metrics.render().decode())
                if s.name == "kvmesh_router_admission_admitted_total"}

    for tenant, tokens in (("big", 100), ("small", 1)):
        admission.admitted.labels(*admission.labels(tenant, 0)).inc(5)
        admission.tokens.labels(tenant, "prompt").inc(tokens)
    assert admitted() == {"big": 5, OTHER: 5}
    admission.tokens.labels("small", "prompt").inc(1000)  # small is the busiest now
    admission.admitted.labels(*admission.labels("small", 0)).inc()
    assert admitted() == {"small": 0, OTHER: 11}  # its 6 of before stay in OTHER, big's 5 join them
    admission.admitted.labels(*admission.labels("small", 0)).inc()
    assert admitted() == {"small": 1, OTHER: 11}  # nothing went down


def test_a_live_router_names_classes_and_the_busiest_tenants_only(tmp_path, stories_path):
    keys = {f"tenant-{i}": f"sk-metrics-tenant-{i:04d}" for i in range(12)}
    keys_file = tmp_path / "keys.yaml"
    keys_file.write_text("keys:\n" + "".join(f"  - {{key: {k}, tenant: {t}}}\n" for t, k in keys.items()))
    admission = AdmissionConfig(keys_file=str(keys_file), metric_tenants=3, ttft_deadline_s={0: 30.0, 20: 60.0})
    with launched_fakes("m") as (fake,):
        cfg = RouterConfig(port=0, block_size=4, admission=admission,
                           upstream=UpstreamConfig(poll_interval_s=0.1, connect_timeout_s=1.0))
        server = RouterServer(cfg, [fake.spec], tokenizer=load_tokenizer(stories_path)).start()
        try:
            wait_for(lambda: server.runtime.router.healthy, what="the fake replica healthy")
            with httpx.Client(base_url=server.url, timeout=10) as client:
                for i, (tenant, key) in enumerate(keys.items()):
                    for priority in range(10):
                        r = client.post("/v1/completions", headers={"Authorization": f"Bearer {key}"},
                                        json={"prompt": f"hello {tenant} " * (1 + i), "max_tokens": 2,
                                              "priority": 3 * priority})
                        assert r.status_code == 200, r.text
                text = client.get("/metrics").text
        finally:
            server.stop()
    samples = admission_samples(text)
    assert {s.labels["priority"] for s in samples if "priority" in s.labels} == {"0", "20"}
    tenants = {s.labels["tenant"] for s in samples if "tenant" in s.labels}
    assert tenants == {"tenant-9", "tenant-10", "tenant-11", OTHER}, tenants  # the longest prompts: most tokens
    assert sum(s.value for s in samples if s.name == "kvmesh_router_admission_admitted_total") == 120


pytestmark = pytest.mark.timeout(120)
