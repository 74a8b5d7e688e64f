"""Work nobody waits for is cancelled; a stream a replica breaks is reported, never passed off as a success."""

from __future__ import annotations

import json

import httpx

from ..leaving_client import post_unread
from .conftest import fake_stats, wait_for
from .test_router_http import prompt


def _status_count(router, status_class: str) -> float:
    reg = router.runtime.metrics.registry
    return reg.get_sample_value("kvmesh_router_requests_total", {"status": status_class}) or 0


def test_non_streaming_client_disconnect_cancels_the_upstream_request(fakes, start_router):
    a, _ = fakes
    router = start_router([a.spec])
    a.configure(delay=20)  # the replica would work for 20 s on each request

    clients = [post_unread(router.url, "/v1/completions", {"prompt": prompt(50 + i), "max_tokens": 64})
               for i in range(5)]
    wait_for(lambda: fake_stats(a)["running"] == 5, what="the 5 requests on the replica")
    for client in clients:  # each client gives up while its request runs
        client.close()
    wait_for(lambda: fake_stats(a)["cancelled"] == 5, timeout=5, what="the replica to see 5 cancellations")
    assert fake_stats(a)["running"] == 0
    load = router.runtime.router.loads.loads["a"]
    wait_for(lambda: load.in_flight == 0 and load.pending_prefill_tokens == 0, what="load accounting")


def test_stream_cut_by_a_dying_replica_ends_with_an_error_event_and_counts_as_5xx(fakes, start_router):
    a, _ = fakes
    router = start_router([a.spec])
    a.configure(cut=True)
    ok_before, bad_before = _status_count(router, "2xx"), _status_count(router, "5xx")
    body = {"prompt": prompt(60), "max_tokens": 4, "stream": True}
    with httpx.stream("POST", router.url + "/v1/completions", json=body, timeout=20) as r:
        assert r.status_code == 200  # headers went out before the replica died
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert json.loads(events[0])["choices"][0]["text"] == "a"  # the output that did arrive
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == 502 and "incomplete" in error["message"]
    wait_for(lambda: _status_count(router, "5xx") == bad_before + 1, what="the stream counted as a 5xx")
    assert _status_count(router, "2xx") == ok_before


def test_completed_stream_counts_as_2xx(fakes, start_router):
    a, _ = fakes
    router = start_router([a.spec])
    ok_before = _status_count(router, "2xx")
    body = {"prompt": prompt(61), "max_tokens": 4, "stream": True}
    with httpx.stream("POST", router.url + "/v1/completions", json=body, timeout=20) as r:
        text = "".join(r.iter_text())
    assert text.rstrip().endswith("data: [DONE]") and '"error"' not in text
    wait_for(lambda: _status_count(router, "2xx") == ok_before + 1, what="the stream counted as a 2xx")
