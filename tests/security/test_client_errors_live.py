"""A client's bad input never ejects a replica: through a live router in front of two real stories260K replicas,
each cheap input of tests/client_error_inputs.py that once made a replica answer 500 (a self-referring schema or
grammar, a constraint ``min_tokens`` or ``allowed_token_ids`` leaves no token, a named tool with such parameters)
is sent 100 times from four threads, half of them streamed. Every answer is the request's error (a 4xx naming the
field, or ``finish_reason: "error"``), and afterwards ``GET /replicas`` shows both replicas healthy, never ejected,
with no failure counted or retried; plain requests are then served."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.runtime import ReplicaRuntime
from kvmesh.replica.server.config import ReplicaServerConfig
from kvmesh.replica.serving.tokenizer import load_tokenizer
from kvmesh.router.config import ReplicaSpec, RouterConfig, UpstreamConfig
from kvmesh.router.control.router_server import RouterServer

from ..client_error_inputs import CLIENT_ERRORS, body, ended_as_the_requests_error, path
from ..conftest import CHAT_TEMPLATE
from ..openai_pair import AUTH, FRONTEND, KEY

pytest.importorskip("xgrammar", reason="structured outputs need xgrammar (the engine extra)")

ADMIN_KEY = "admin-key-client-errors"
ONCE_A_500 = ("schema_self_ref", "grammar_root_is_root", "choice_with_min_tokens", "regex_outside_allowed_token_ids",
              "named_tool_self_ref", "grammar_only_eos_with_min_tokens",
              "stop_token_id_outside_the_vocabulary_with_min_tokens")
"""The inputs each replica answered with a 500 (which the router counted and retried) before they were the
request's errors."""
TIMES = 100
BUDGET_S = 60.0


@pytest.fixture(scope="module")
def router(stories_path):
    """A router (outlier detection at its defaults: 3 failures in a row eject) in front of replicas r0 and r1."""
    replicas = [ReplicaRuntime.start(EngineConfig(model=str(stories_path), kv_cache_memory=4 << 20, max_num_seqs=32),
                                     ReplicaServerConfig(port=0, event_port=0, replay_port=0, api_key=KEY,
                                                         served_model_name="stories"), frontend=FRONTEND)
                for _ in range(2)]
    specs = []
    for i, replica in enumerate(replicas):
        events = replica.endpoints()
        specs.append(ReplicaSpec(replica.http.url, events["events_endpoint"], events["replay_endpoint"],
                                 replica_id=f"r{i}"))
    server = RouterServer(RouterConfig(port=0, api_key=KEY, admin_key=ADMIN_KEY, served_model_name="stories",
                                       frontend=FRONTEND,
                                       upstream=UpstreamConfig(poll_interval_s=0.2, replica_api_key=KEY)),
                          specs, tokenizer=load_tokenizer(stories_path, chat_template=CHAT_TEMPLATE)).start()
    try:
        yield server
    finally:
        server.stop()
        for replica in replicas:
            replica.shutdown(graceful_s=1)


def _send(client: httpx.Client, url: str, name: str, i: int) -> str | None:
    _, kind, fields, param = next(c for c in CLIENT_ERRORS if c[0] == name)
    stream = i % 2 == 1
    r = client.post(url + path(kind), headers=AUTH, json=body(kind, fields, stream), timeout=30)
    wrong = ended_as_the_requests_error(r.status_code, r.text, stream, param)
    return None if wrong is None else f"{name} #{i}: {wrong}"


def test_a_hundred_of_each_bad_input_leave_every_replica_healthy(router):
    started = time.monotonic()
    jobs = [(name, i) for i in range(TIMES) for name in ONCE_A_500]
    with httpx.Client() as client, ThreadPoolExecutor(4) as pool:
        wrong = [w for w in pool.map(lambda job: _send(client, router.url, *job), jobs) if w is not None]
    took = time.monotonic() - started
    assert not wrong, f"{len(wrong)} of {len(jobs)} answers were not the request's error: {wrong[:5]}"
    assert took < BUDGET_S, f"{len(jobs)} bad requests took {took:.1f} s"
    rows = httpx.get(router.url + "/replicas", headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                     timeout=10).json()["replicas"]
    assert {row["id"] for row in rows} == {"r0", "r1"}
    for row in rows:
        assert row["healthy"], row
        assert not row.get("ejected") and not row.get("ejections") and not row.get("last_failure"), row
    metrics = router.runtime.metrics.registry
    assert not any(metrics.get_sample_value("kvmesh_router_replica_failures_total", {"replica": rid, "kind": kind})
                   for rid in ("r0", "r1") for kind in ("http_5xx", "mid_stream", "reset", "invalid_json")), \
        "a replica was counted a failure for a request's error"
    assert not any(metrics.get_sample_value("kvmesh_router_retries_total", {"replica": rid}) for rid in ("r0", "r1"))
    for i in range(4):  # plain requests are served
        r = httpx.post(router.url + "/v1/completions", headers=AUTH, timeout=30,
                       json={"prompt": f"Once upon a time {i}", "max_tokens": 4})
        assert r.status_code == 200, r.text
    records, outliers = router.runtime.router.replicas, router.runtime.outliers
    assert not outliers.is_ejected(records.get("r0")) and not outliers.is_ejected(records.get("r1"))
