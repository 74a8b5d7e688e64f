"""Passive health: a replica that answers /health but not requests costs a request one deadline, then is out of
rotation until a probe request is answered; a slow replica that shows progress is waited for, not ejected;
answers that are not JSON or SSE never reach the client and count against their replica.

Real fake replicas (cluster/measure/benchmarks/support/fake_replica.py, one process each) behind a real router, with
deadlines
of a second (``first_byte_timeout_s``, ``stream_idle_timeout_s``) and round-robin routing, so every wave sends
half its requests to the sick replica unless it is out of rotation.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
from kvmesh.cluster.cli import main
from kvmesh.router.routing.outlier import OutlierConfig
from kvmesh.router.routing.receipts import HEADER_FAILED_OVER, HEADER_PREDICTED

from .conftest import ADMIN_KEY, BLOCK_SIZE, replica_rows, wait_for
from .test_router_http import prompt

FAST = {"upstream": {"first_byte_timeout_s": 1.0, "stream_idle_timeout_s": 1.0}, "policy": "round_robin"}


def post(router, ids, **kw) -> httpx.Response:
    return httpx.post(router.url + "/v1/completions", json={"prompt": ids, "max_tokens": 2, **kw},
                      headers={"x-kvmesh-receipt": "1"}, timeout=30)


def wave(router, seed: int, n: int = 8, **kw) -> list[httpx.Response]:
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda i: post(router, prompt(seed + i), **kw), range(n)))


def row(router, name: str) -> dict:
    rows = replica_rows(router)
    return next(r for r in rows if r["id"] == name)


def sample(router, name: str, **labels) -> float:
    return router.runtime.metrics.registry.get_sample_value(f"kvmesh_router_{name}_total", labels) or 0


def both_healthy(router) -> None:
    wait_for(lambda: len(router.runtime.router.healthy) == 2, what="both replicas healthy")


def test_never_answering_replica_costs_one_deadline_then_is_out_of_rotation(fakes, start_router, capsys,
                                                                            monkeypatch):
    a, b = fakes
    a.configure(delay=3600)  # answers /health, /load and /server_info; never a completion
    router = start_router([a.spec, b.spec], **FAST)
    both_healthy(router)

    first = wave(router, 6000)
    assert [r.status_code for r in first] == [200] * 8
    assert {r.json()["choices"][0]["text"] for r in first} == {"b"}
    moved = [r.headers[HEADER_FAILED_OVER] for r in first if HEADER_FAILED_OVER in r.headers]
    assert moved and all(m == "a: first_byte_deadline" for m in moved), moved
    ejected = row(router, "a")
    assert ejected["ejected"] and not ejected["healthy"] and "first bytes" in ejected["last_failure"]

    second = wave(router, 6100)
    assert {r.json()["choices"][0]["text"] for r in second} == {"b"}
    assert not [r for r in second if HEADER_FAILED_OVER in r.headers]  # none went to "a" first
    assert sample(router, "replica_ejections", replica="a") >= 1
    assert sample(router, "replica_failures", replica="a", kind="first_byte_deadline") >= 1
    assert sample(router, "replica_failures", replica="b", kind="first_byte_deadline") == 0
    monkeypatch.setenv("KVMESH_ADMIN_KEY", ADMIN_KEY)  # status reads the replica list with it
    assert main(["status", "--url", router.url]) == 0
    shown = capsys.readouterr().out
    assert "EJECTED" in shown and "a: ejected after failures in a row -- " in shown  # the last: a missed deadline,
    assert ("missed a deadline" in shown or "its probe request failed" in shown)   # or, on a slow machine, a probe


def test_ejected_replica_comes_back_when_its_probe_request_is_answered(fakes, start_router):
    a, b = fakes
    a.configure(delay=3600)
    router = start_router([a.spec, b.spec], outliers=OutlierConfig(base_ejection_s=0.5, max_ejection_s=1.0), **FAST)
    both_healthy(router)
    assert {r.json()["choices"][0]["text"] for r in wave(router, 6200, n=2)} == {"b"}
    wait_for(lambda: row(router, "a").get("ejections", 0) >= 2, what="a failed probe request ejecting 'a' again")
    assert row(router, "a")["ejected"]

    a.configure(delay=0)  # cured: the next probe request is answered
    wait_for(lambda: "a" in router.runtime.router.healthy, what="'a' re-admitted")
    assert not row(router, "a").get("ejected")
    assert {r.json()["choices"][0]["text"] for r in wave(router, 6300, n=4)} == {"a", "b"}


def test_slow_replica_that_shows_progress_is_waited_for_and_not_ejected(fakes, start_router):
    a, b = fakes
    a.configure(delay=2.5, progress=True)  # its /load shows a prefill queue shrinking meanwhile
    router = start_router([a.spec, b.spec], **FAST)
    both_healthy(router)
    out = wave(router, 6400, n=4)
    assert sorted(r.json()["choices"][0]["text"] for r in out) == ["a", "a", "b", "b"]
    assert not [r for r in out if HEADER_FAILED_OVER in r.headers]
    assert not row(router, "a").get("ejected") and "a" in router.runtime.router.healthy
    assert sample(router, "replica_failures", replica="a", kind="first_byte_deadline") == 0


def test_a_replica_compiling_a_requests_grammar_is_waited_for_and_not_ejected(fakes, start_router):
    """A grammar that compiles past the first-byte deadline is the request's work: ``/load``'s
    ``num_grammar_compiles`` is progress, so the replica is neither failed over nor ejected."""
    a, b = fakes
    a.configure(delay=2.5, compiling=True)
    router = start_router([a.spec, b.spec], **FAST)
    both_healthy(router)
    out = wave(router, 6450, n=4)
    assert sorted(r.json()["choices"][0]["text"] for r in out) == ["a", "a", "b", "b"]
    assert not [r for r in out if HEADER_FAILED_OVER in r.headers]
    assert not row(router, "a").get("ejected") and "a" in router.runtime.router.healthy
    assert sample(router, "replica_failures", replica="a", kind="first_byte_deadline") == 0


def stream_events(router, ids) -> list[str]:
    with httpx.stream("POST", router.url + "/v1/completions", json={"prompt": ids, "max_tokens": 2, "stream": True},
                      timeout=30) as r:
        assert r.status_code == 200, r.read()
        return [line[6:] for line in r.iter_lines() if line.startswith("data: ")]


def test_stream_that_stalls_ends_with_an_error_event_after_the_idle_deadline(fakes, start_router):
    a, b = fakes
    router = start_router([a.spec, b.spec], **FAST)
    both_healthy(router)
    router.runtime.drain(router.runtime.replicas.get("b"))  # the stream goes to "a"; no replica to move it to
    ids = prompt(6500)
    # "a" computes the prompt first and the router takes in all its KV events, so nothing "a" publishes
    # later reads as work on other requests while the stream stalls (on a loaded machine the router could
    # still be applying the prompt's BlockStored events when the idle deadline runs out)
    assert post(router, ids).status_code == 200
    wait_for(lambda: int(post(router, ids).headers.get(HEADER_PREDICTED, 0)) >= len(ids) - BLOCK_SIZE, 30,
             "the router to hold a's blocks of the prompt")
    a.configure(stall_after=1)  # one chunk, then nothing on an open connection
    events = stream_events(router, ids)
    assert events[-1] == "[DONE]"
    assert "error" in json.loads(events[-2]), events  # the stream's last event before [DONE]
    error = json.loads(events[-2])["error"]
    assert "not within 1s" in error["message"] and error["code"] == 502, error
    assert json.loads(events[0])["choices"][0]["text"] == "a"  # what went out before the stall stays
    assert sample(router, "replica_failures", replica="a", kind="stream_idle_deadline") == 1, error


def test_answer_that_is_not_json_is_retried_elsewhere_and_counted(fakes, start_router):
    a, b = fakes
    a.configure(garbage=True)  # a 200 whose body is HTML
    router = start_router([a.spec, b.spec], **FAST)
    both_healthy(router)
    out = wave(router, 6600, n=4)
    assert [r.status_code for r in out] == [200] * 4
    assert {r.json()["choices"][0]["text"] for r in out} == {"b"}
    assert sample(router, "replica_failures", replica="a", kind="invalid_json") >= 1
    assert row(router, "a")["ejected"]


def test_stream_event_that_is_not_sse_json_never_reaches_the_client(fakes, start_router):
    a, b = fakes
    a.configure(garbage=True)  # "data: garbage"
    router = start_router([a.spec, b.spec], **FAST)
    both_healthy(router)
    for i in range(2):  # round robin: one of the two goes to "a" first, and moves to "b" before any byte went out
        events = stream_events(router, prompt(6700 + i))
        assert "garbage" not in events and events[-1] == "[DONE]"
        assert not [e for e in events[:-1] if "error" in json.loads(e)], events
    assert sample(router, "replica_failures", replica="a", kind="invalid_sse") == 1


def test_a_killed_replica_is_back_as_soon_as_it_answers_health_again(fakes, start_router):
    a, b = fakes
    router = start_router([a.spec, b.spec], policy="round_robin",
                          outliers=OutlierConfig(consecutive_failures=1))  # 1 failure ejects
    core = router.runtime.router
    both_healthy(router)
    a.configure(delay=30)  # holds its requests
    with ThreadPoolExecutor(2) as pool:
        outs = [pool.submit(post, router, prompt(6800 + i)) for i in range(2)]
        wait_for(lambda: core.loads.loads["a"].in_flight == 1, what="a request held by 'a'")
        a.kill()  # its connection resets: a failure, which ejects it (for 30 s by default)
        assert {f.result(timeout=20).json()["choices"][0]["text"] for f in outs} == {"b"}
    assert row(router, "a")["ejections"] == 1
    a.launch().wait_ready()  # /health failed meanwhile: down, not an outlier; the restarted one needs only /health
    wait_for(lambda: "a" in core.healthy, what="the restarted replica back in rotation, well before 30 s")
    assert not row(router, "a").get("ejected")
