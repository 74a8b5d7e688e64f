"""Whose fault a failed answer is (router/http/failures.py): a 4xx, or a stream's error event with a 4xx ``code``, is
the request's -- passed to the client, never retried, migrated or counted towards the replica's ejection; a 5xx is
the replica's -- unless every replica the request went to answered it so (a poison request)."""

from __future__ import annotations

import httpx
from kvmesh.router.http.failures import caused_by_request, request_error_event
from kvmesh.router.http.migration import MigratingStream

from .test_migration_state import chunk, completion
from .test_router_http import prompt


def test_a_4xx_is_the_requests_and_a_5xx_the_replicas():
    assert all(caused_by_request(s) for s in (400, 404, 413, 422, 429))
    assert not any(caused_by_request(s) for s in (200, 500, 502, 503, 504))


def test_an_error_events_code_says_whose_it_is():
    assert request_error_event(b'data: {"error": {"message": "min_tokens: ...", "type": "invalid_request_error", '
                               b'"param": "min_tokens", "code": 400}}')
    assert request_error_event(b'data: {"error":{"message":"x","code":"404"}}')
    assert not request_error_event(b'data: {"error": {"message": "engine failed", "code": 500}}')
    assert not request_error_event(b'data: {"error": {"message": "no code"}}')


def test_a_streams_request_error_goes_to_the_client_and_does_not_break_the_upstream():
    s = MigratingStream(completion(), chat=False, prompt_ids=[1, 2, 3], tokenizer=None, limit=3)
    s.relay(chunk("a", [5]))
    event = b'data: {"error": {"message": "tools: no token", "param": "tools", "code": 400}}'
    assert s.relay(event) == event + b"\n\n" and s.broken is None and s.finish_reason == "error"
    assert s.relay(b"data: [DONE]") is not None and s.done
    s = MigratingStream(completion(), chat=False, prompt_ids=[1, 2, 3], tokenizer=None, limit=3)
    assert s.relay(b'data: {"error": {"message": "boom", "code": 500}}') is None and "boom" in s.broken


def test_a_finish_reason_error_ends_the_stream_without_a_migration():
    s = MigratingStream(completion(), chat=False, prompt_ids=[1, 2, 3], tokenizer=None, limit=3)
    s.relay(chunk("", [], finish="error"))
    assert s.broken is None and s.finish_reason == "error"


def test_a_replicas_400_is_passed_through_not_retried_and_not_counted(fakes, start_router):
    a, b = fakes
    router = start_router([a.spec, b.spec], upstream={"max_attempts": 2})
    a.configure(status=400)
    b.configure(status=400)
    metrics = router.runtime.metrics.registry
    for i in range(8):
        r = httpx.post(router.url + "/v1/completions", json={"prompt": prompt(700 + i)}, timeout=20)
        assert r.status_code == 400 and r.json()["error"]["code"] == 400
        assert r.headers.get("x-kvmesh-failed-over") is None
    for replica in router.runtime.router.replicas:
        assert replica.health.consecutive_failures == 0 and replica.health.ejected_until is None, replica.id
        assert replica.healthy
    assert not any(metrics.get_sample_value("kvmesh_router_replica_failures_total", {"replica": f.name, "kind": k})
                   for f in fakes for k in ("http_5xx", "reset", "connect"))
    assert not any(metrics.get_sample_value("kvmesh_router_retries_total", {"replica": f.name}) for f in fakes)


def test_a_replicas_500_is_retried_and_counted(fakes, start_router):
    """The other side of the rule: the replica's own failure moves the request and counts against it."""
    a, b = fakes
    router = start_router([a.spec, b.spec], upstream={"max_attempts": 2})
    a.configure(status=500)
    outs = [httpx.post(router.url + "/v1/completions", json={"prompt": prompt(800 + i)}, timeout=20) for i in range(4)]
    assert all(r.status_code == 200 and r.json()["choices"][0]["text"] == "b" for r in outs)
    assert router.runtime.metrics.registry.get_sample_value("kvmesh_router_replica_failures_total",
                                                            {"replica": "a", "kind": "http_5xx"})


def test_a_request_every_replica_answers_5xx_is_the_requests_fault(fakes, start_router):
    """Two replicas that both answer a request with a 5xx say the request is what fails: nothing counted, nobody
    ejected however often it is sent; the client gets the last replica's error."""
    a, b = fakes
    router = start_router([a.spec, b.spec], upstream={"max_attempts": 2})
    a.configure(status=500)
    b.configure(status=500)
    for i in range(6):
        r = httpx.post(router.url + "/v1/completions", json={"prompt": prompt(900 + i)}, timeout=20)
        assert r.status_code == 500 and "error" in r.json()
    metrics = router.runtime.metrics.registry
    assert not any(metrics.get_sample_value("kvmesh_router_replica_failures_total", {"replica": f.name,
                                                                                     "kind": "http_5xx"})
                   for f in fakes)
    assert all(r.healthy and r.health.ejected_until is None for r in router.runtime.router.replicas)
