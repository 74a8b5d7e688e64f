"""/metrics of a real replica (stories260K) and of a router in front of it: vLLM's names for the
dashboards people already have, kvmesh's own names valid for promtool, OpenMetrics on request."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from kvmesh.router.routing.ceiling import MISS_KINDS
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from . import openai_pair
from .openai_pair import AUTH

pair = openai_pair.pair  # the fixture
DASHBOARD = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "kvmesh-cluster.json"

# Every series vLLM's own Grafana dashboard queries, all with {model_name="$model_name"}
# (vLLM: examples/online_serving/prometheus_grafana/grafana.json).
VLLM_DASHBOARD_SERIES = (
    "vllm:e2e_request_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_sum",
    "vllm:e2e_request_latency_seconds_count", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
    "vllm:time_per_output_token_seconds_bucket", "vllm:time_per_output_token_seconds_sum",
    "vllm:time_per_output_token_seconds_count", "vllm:num_requests_running", "vllm:num_requests_waiting",
    "vllm:time_to_first_token_seconds_bucket", "vllm:time_to_first_token_seconds_sum",
    "vllm:time_to_first_token_seconds_count", "vllm:gpu_cache_usage_perc", "vllm:request_prompt_tokens_bucket",
    "vllm:request_generation_tokens_bucket", "vllm:request_success_total", "vllm:request_queue_time_seconds_sum",
    "vllm:request_prefill_time_seconds_sum", "vllm:request_decode_time_seconds_sum",
    "vllm:request_max_num_generation_tokens_sum",
)


@pytest.fixture(scope="module")
def scraped(pair):
    """(replica text, router text) after a plain and a streamed completion through the router."""
    replica_url, router_url = pair
    body = {"prompt": "Once upon a time", "max_tokens": 6, "ignore_eos": True}
    for stream in (False, True):
        r = httpx.post(router_url + "/v1/completions", json={**body, "stream": stream}, headers=AUTH, timeout=60)
        assert r.status_code == 200, r.text
    return httpx.get(replica_url + "/metrics").text, httpx.get(router_url + "/metrics").text


def samples(text: str) -> dict[str, list]:
    """Sample name -> its samples, from the text exposition."""
    out: dict[str, list] = {}
    for family in parse_text(text):
        for s in family.samples:
            out.setdefault(s.name, []).append(s)
    return out


def value(text: str, name: str, **labels: str) -> float:
    return sum(s.value for s in samples(text).get(name, []) if labels.items() <= s.labels.items())


def test_every_series_of_vllms_grafana_dashboard_is_exposed_with_its_model_name(scraped):
    found = samples(scraped[0])
    for name in VLLM_DASHBOARD_SERIES:
        assert any(s.labels.get("model_name") == "stories" for s in found.get(name, [])), name


def test_the_request_phases_add_up_to_the_inference_time(scraped):
    replica = scraped[0]
    finished = value(replica, "vllm:request_success_total")
    assert finished >= 2 and value(replica, "vllm:e2e_request_latency_seconds_count") == finished
    phases = value(replica, "vllm:request_prefill_time_seconds_sum") + value(
        replica, "vllm:request_decode_time_seconds_sum")
    assert value(replica, "vllm:request_inference_time_seconds_sum") == pytest.approx(phases)
    assert value(replica, "vllm:request_generation_tokens_sum") == value(replica, "vllm:generation_tokens_total")
    assert value(replica, "vllm:iteration_tokens_total_count") > 0


def test_the_routers_metrics_carry_every_vllm_series_of_its_replicas_labelled_by_replica(scraped):
    replica, router = scraped
    replica_names = {name for name in samples(replica) if name.startswith("vllm:")}
    router_names = {name for name in samples(router) if name.startswith("vllm:")}
    assert replica_names and router_names == replica_names  # the same names: a vLLM dashboard finds them
    def series(text: str, name: str) -> set:
        return {tuple(sorted(s.labels.items())) for s in samples(text)[name]}

    for name in router_names:  # the replica's own series, each with replica="r0" added
        assert series(router, name) == {tuple(sorted({**dict(labels), "replica": "r0"}.items()))
                                        for labels in series(replica, name)}, name
    for name in ("vllm:prompt_tokens_total", "vllm:request_success_total", "vllm:e2e_request_latency_seconds_count"):
        assert value(router, name) == value(replica, name) > 0, name
    assert value(router, "kvmesh_router_fleet_scrape_up", replica="r0") == 1


def test_cache_config_info_describes_the_kv_cache(scraped):
    (info,) = samples(scraped[0])["vllm:cache_config_info"]
    assert info.value == 1 and info.labels["block_size"] == "16" and int(info.labels["num_gpu_blocks"]) > 0


def test_no_kvmesh_metric_name_contains_a_colon(scraped):
    for text in scraped:
        names = {s for s in samples(text) if not s.startswith("vllm:")}
        assert names and not [n for n in names if ":" in n]


def test_both_servers_export_the_process_collectors(scraped):
    for text in scraped:
        assert value(text, "process_cpu_seconds_total") > 0 and "python_info" in samples(text)


def test_router_times_requests_and_streams_by_model_name(pair, scraped):
    router = scraped[1]
    assert value(router, "kvmesh_router_request_latency_seconds_count", model_name="stories") >= 2
    assert value(router, "kvmesh_router_time_to_first_token_seconds_count", model_name="stories") >= 1
    _, router_url = pair
    before = value(router, "kvmesh_router_time_to_first_token_seconds_count")
    httpx.post(router_url + "/v1/completions", json={"prompt": "Once", "max_tokens": 2}, headers=AUTH, timeout=60)
    after = httpx.get(router_url + "/metrics").text
    assert value(after, "kvmesh_router_time_to_first_token_seconds_count") == before  # not streamed: no TTFT
    assert value(after, "kvmesh_router_request_latency_seconds_count") == value(
        router, "kvmesh_router_request_latency_seconds_count") + 1


# What Prometheus 2.x and 3.x send by default, and a scraper that wants the classic text only.
PROMETHEUS_2_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
                       "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
PROMETHEUS_3_ACCEPT = ("application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,application/"
                       "openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,"
                       "text/plain;version=0.0.4;q=0.3,*/*;q=0.2")


@pytest.mark.parametrize("accept", [PROMETHEUS_2_ACCEPT, PROMETHEUS_3_ACCEPT], ids=["prometheus2", "prometheus3"])
def test_openmetrics_is_served_to_prometheus_with_vllms_names_intact(scraped, pair, accept):
    for url in pair:
        r = httpx.get(url + "/metrics", headers={"accept": accept})
        assert r.headers["content-type"] == "application/openmetrics-text; version=1.0.0; charset=utf-8"
        assert r.text.endswith("# EOF\n")
        names = {s.name for family in parse_openmetrics(r.text) for s in family.samples}
        assert "process_cpu_seconds_total" in names
        assert set(VLLM_DASHBOARD_SERIES) <= names  # the colon survives (no escaping of vLLM's names)


@pytest.mark.parametrize("accept", [None, "text/plain", "application/openmetrics-text;q=0"])
def test_the_classic_text_format_is_the_default(pair, accept):
    for url in pair:
        r = httpx.get(url + "/metrics", headers={"accept": accept} if accept else {})
        assert r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
        assert "# EOF" not in r.text


def promtool_problems(text: str) -> list[str]:
    """``promtool check metrics`` on an exposition: its lint findings (one line each)."""
    res = subprocess.run(["promtool", "check", "metrics"], input=text.encode(), capture_output=True, timeout=60)
    assert res.returncode in (0, 3), res.stderr.decode()  # 3 = lint findings; anything else = unparsable
    return [line for line in (res.stdout + res.stderr).decode().splitlines() if line.strip()]


@pytest.mark.skipif(shutil.which("promtool") is None,
                    reason="promtool not on PATH (Debian: apt-get install prometheus)")
def test_promtool_check_metrics_passes_on_kvmesh_names(scraped):
    for text in scraped:  # vLLM's own names (the router passes its replicas' on), kept verbatim for its dashboards
        for problem in promtool_problems(text):
            assert problem.startswith("vllm:"), problem


def test_the_grafana_dashboard_queries_only_exposed_series(scraped):
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert exprs
    exposed = set(samples(scraped[0])) | set(samples(scraped[1]))
    for expr in exprs:
        for name in re.findall(r"\b((?:vllm:|kvmesh_)[a-zA-Z0-9_:]+)", expr):
            assert name in exposed, f"{name} (in {expr!r}) is not exported"


def test_the_router_exports_its_live_single_pool_ceiling(pair):
    """The ghost pool takes the replica's blocks from its /load; a prompt sent twice is a ceiling hit the second
    time, and every prompt token is a reported hit or a miss of one kind."""
    replica_url, router_url = pair
    blocks = httpx.get(replica_url + "/load", headers=AUTH).json()["num_kv_blocks"]
    deadline = time.monotonic() + 10
    while value(httpx.get(router_url + "/metrics").text, "kvmesh_router_ceiling_capacity_blocks") != blocks - 1:
        assert time.monotonic() < deadline, "the router never took the replica's blocks from its /load"
        time.sleep(0.1)
    before = httpx.get(router_url + "/metrics").text
    body = {"prompt": "Once upon a time there was a little girl who lived in a village near the forest. " * 3,
            "max_tokens": 4}
    for _ in range(2):
        r = httpx.post(router_url + "/v1/completions", json=body, headers=AUTH, timeout=60)
        assert r.status_code == 200, r.text
    prompt = r.json()["usage"]["prompt_tokens"]
    after = httpx.get(router_url + "/metrics").text

    def grew(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert grew("kvmesh_router_ceiling_prompt_tokens_total") == 2 * prompt
    assert grew("kvmesh_router_ceiling_hit_tokens_total") == (prompt - 1) // 16 * 16  # the second: all but the last
    missed = sum(grew("kvmesh_router_prompt_miss_tokens_total", kind=k) for k in MISS_KINDS)
    assert missed == 2 * prompt - grew("kvmesh_router_ceiling_reported_hit_tokens_total")
    assert 0 < value(after, "kvmesh_router_hit_share_of_ceiling") <= 1
