"""The fleet's vllm:* series on the router's /metrics (router/http/fleet_metrics.py): only vLLM's families, relabelled
by replica, bounded per replica; a replica whose /metrics cannot be read gives none and is named as not read."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import httpx
from kvmesh.router.http.fleet_metrics import MAX_BODY_BYTES, FleetMetrics, vllm_families
from kvmesh.router.http.upstream_connection import UpstreamConnectError
from kvmesh.router.replicas.replica import Replica
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from .conftest import ADMIN

REPLICA_TEXT = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 40.0
# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{engine="0",le="1.0",model_name="m"} 3.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 4.0
vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 4.0
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="m"} 2.5
# HELP kvmesh_http_requests_total HTTP requests.
# TYPE kvmesh_http_requests_total counter
kvmesh_http_requests_total{endpoint="/v1/completions",status="200"} 4.0
"""


def scrape(fleet: FleetMetrics, answers: dict[str, tuple[int, bytes] | Exception]) -> dict:
    async def fetch(url: str) -> tuple[int, bytes]:
        answer = answers[url]
        if isinstance(answer, Exception):
            raise answer
        return answer

    replicas = [Replica(url, spec=SimpleNamespace(url=url)) for url in answers]  # each named by its URL
    asyncio.run(fleet.refresh(replicas, fetch))
    registry = CollectorRegistry()
    registry.register(fleet)
    out: dict = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            out.setdefault(s.name, []).append(s)
    return out


def test_only_vllms_families_are_kept_each_sample_labelled_with_its_replica():
    found = scrape(FleetMetrics(), {"r0": (200, REPLICA_TEXT.encode()), "r1": (200, REPLICA_TEXT.encode())})
    assert "kvmesh_http_requests_total" not in found
    running = found["vllm:num_requests_running"]
    assert sorted(s.labels["replica"] for s in running) == ["r0", "r1"]
    assert sum(s.value for s in running) == 4.0  # summed by model_name, a vLLM dashboard reads the fleet
    assert len(found["vllm:e2e_request_latency_seconds_bucket"]) == 4
    assert {s.labels["model_name"] for s in found["vllm:prompt_tokens_total"]} == {"m"}


def test_a_replica_that_cannot_be_read_gives_no_series_and_is_named():
    found = scrape(FleetMetrics(), {"ok": (200, REPLICA_TEXT.encode()), "json": (200, b'{"status": "ok"} {'),
                                    "down": ConnectionRefusedError("refused"), "slow": asyncio.TimeoutError(),
                                    "gone": UpstreamConnectError("the connection closed before the request was sent"),
                                    "err": (500, REPLICA_TEXT.encode()),
                                    "huge": (200, REPLICA_TEXT.encode() * (MAX_BODY_BYTES // len(REPLICA_TEXT) + 1))})
    assert {s.labels["replica"] for s in found["vllm:num_requests_running"]} == {"ok"}
    up = {s.labels["replica"]: s.value for s in found["kvmesh_router_fleet_scrape_up"]}
    assert up == {"ok": 1.0, "json": 0.0, "down": 0.0, "slow": 0.0, "gone": 0.0, "err": 0.0, "huge": 0.0}


def test_a_replica_flooding_series_is_cut_at_the_bound():
    flood = "# TYPE vllm:x gauge\n" + "".join(f'vllm:x{{i="{i}"}} 1\n' for i in range(5000))
    kept = vllm_families(flood + REPLICA_TEXT, max_series=100)
    assert sum(len(f.samples) for f in kept) == 100


def test_a_replica_removed_from_the_set_is_forgotten():
    fleet = FleetMetrics()
    scrape(fleet, {"r0": (200, REPLICA_TEXT.encode()), "r1": (200, REPLICA_TEXT.encode())})
    found = scrape(fleet, {"r1": (200, REPLICA_TEXT.encode())})
    assert {s.labels["replica"] for s in found["vllm:num_requests_running"]} == {"r1"}
    assert {s.labels["replica"] for s in found["kvmesh_router_fleet_scrape_up"]} == {"r1"}


def test_the_routers_metrics_name_a_replica_that_serves_no_prometheus_text(fakes, start_router):
    router = start_router([f.spec for f in fakes])  # a fake answers any GET with JSON
    r = httpx.get(router.url + "/metrics", headers=ADMIN, timeout=20)
    assert r.status_code == 200
    assert 'kvmesh_router_fleet_scrape_up{replica="a"} 0.0' in r.text and "\nvllm:" not in r.text
