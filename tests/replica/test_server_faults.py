"""Faults at the HTTP edge: disconnects abort and free blocks, one failing request fails alone, auth, draining."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import socket
import time

import httpx
import pytest
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.runtime import ReplicaRuntime
from kvmesh.replica.server.config import ReplicaServerConfig
from kvmesh.replica.worker.fake_runner import FakeModelRunner

POISON = 511  # a prompt ending in this token makes the engine fail that request (injected below)
POISON_LATE = 510  # ... fail it after its third token (mid-stream)
LONG = {"max_tokens": 400, "ignore_eos": True, "temperature": 0}


@pytest.fixture(scope="module")
def replica(stories_path):
    config = EngineConfig(model=str(stories_path), kv_cache_memory=4 << 20)
    runtime = ReplicaRuntime.start(config, ReplicaServerConfig(port=0, event_port=None))
    engine = runtime.llm.engine
    real_append = engine.output_processor.append_token

    def append_or_fail(request, token, now):  # runs on the engine thread
        last = request.prompt_token_ids[-1]
        if last == POISON or (last == POISON_LATE and request.num_output_tokens >= 3):
            raise RuntimeError("injected failure")
        return real_append(request, token, now)

    engine.output_processor.append_token = append_or_fail
    yield runtime
    runtime.shutdown(graceful_s=1)


def wait_idle(runtime, timeout_s: float = 20.0) -> None:
    """Until no request is left and every KV block is free again."""
    deadline = time.monotonic() + timeout_s
    manager = runtime.llm.engine.kv_cache_manager
    while time.monotonic() < deadline:
        if runtime.llm.num_unfinished() == 0 and manager.usage == 0.0:
            return
        time.sleep(0.05)
    raise AssertionError(f"still busy: {runtime.llm.num_unfinished()} requests, usage {manager.usage}")


def aborted(runtime) -> int:
    return runtime.llm.get_stats().num_finished.get("abort", 0)


def test_disconnect_mid_stream_aborts_and_frees_blocks(replica):
    before = aborted(replica)
    with httpx.Client(base_url=replica.http.url, timeout=30) as c, \
            c.stream("POST", "/v1/completions", json={"prompt": "Once upon a time", "stream": True, **LONG}) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]
        assert any(line.startswith("data: ") for line in got)
        assert replica.llm.engine.kv_cache_manager.usage > 0
    wait_idle(replica)
    assert aborted(replica) == before + 1


def test_disconnect_while_waiting_for_full_response_aborts(replica):
    before = aborted(replica)
    body = json.dumps({"prompt": "Once upon a time", **LONG}).encode()
    host, port = replica.http.host, replica.http.port
    with socket.create_connection((host, port)) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        deadline = time.monotonic() + 10
        while replica.llm.num_unfinished() == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
    wait_idle(replica)
    assert aborted(replica) == before + 1


def test_clients_gone_at_random_points_leave_the_engine_serving(replica, monkeypatch):
    """Clients that close their connection anywhere between sending and the answer (before the engine took the
    request, while it runs, streaming or not) leave no request running and the engine loop alive. Steps are slowed
    so that a request waits for the engine thread a while: the window a disconnect lands in before acceptance."""
    engine, rng = replica.llm.engine, random.Random(7)
    step = engine.step
    monkeypatch.setattr(engine, "step", lambda: (time.sleep(0.01), step())[1])
    host, port = replica.http.host, replica.http.port
    for n in range(40):
        body = json.dumps({"prompt": "Once upon a time", "stream": n % 2 == 0, **LONG}).encode()
        with socket.create_connection((host, port)) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            time.sleep(rng.uniform(0.0, 0.02))
    wait_idle(replica)
    assert replica.llm.errored is None and replica.llm.is_running
    assert httpx.get(replica.http.url + "/health", timeout=10).status_code == 200
    r = httpx.post(replica.http.url + "/v1/completions", json={"prompt": "Once", "max_tokens": 4}, timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4


def test_a_stream_that_breaks_mid_way_ends_with_an_error_event_then_done(replica):
    """vLLM's shape: ``data: {"error": {...}}`` then ``data: [DONE]`` after the chunks already sent, so a client
    (the OpenAI SDK raises on it) sees the stream failed rather than a short answer."""
    body = {"prompt": [1, 9, POISON_LATE], "max_tokens": 20, "stream": True, "ignore_eos": True}
    r = httpx.post(replica.http.url + "/v1/completions", json=body, timeout=60)
    events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert r.status_code == 200 and events[-1] == "[DONE]", events
    chunks, error = [json.loads(e) for e in events[:-2]], json.loads(events[-2])["error"]
    assert chunks and all(c["choices"][0]["finish_reason"] is None for c in chunks)  # text went out first
    assert error["code"] == 500 and error["type"] and "request id" in error["message"]
    wait_idle(replica)


async def test_exception_inside_one_request_fails_only_that_request(replica, caplog):
    caplog.set_level(logging.ERROR, logger="kvmesh.replica.server.answer_renderer")
    async with httpx.AsyncClient(base_url=replica.http.url, timeout=60) as c:
        good = c.post("/v1/completions", json={"prompt": [1, 403, 407], "max_tokens": 20, "ignore_eos": True})
        bad = c.post("/v1/completions", json={"prompt": [1, 403, POISON], "max_tokens": 20})
        bad_stream = c.post("/v1/completions", json={"prompt": [1, 9, POISON], "max_tokens": 20, "stream": True})
        good_r, bad_r, bad_stream_r = await asyncio.gather(good, bad, bad_stream)
        assert good_r.status_code == 200 and good_r.json()["usage"]["completion_tokens"] == 20
        # the answers name a request id; the exception's text is the replica's log's, not the client's
        message = bad_r.json()["error"]["message"]
        assert bad_r.status_code == 500 and "request id" in message and "injected failure" not in bad_r.text
        events = [line for line in bad_stream_r.text.splitlines() if line.startswith("data: ")]
        stream_error = json.loads(events[-2][6:])["error"]
        assert stream_error["code"] == 500 and "request id" in stream_error["message"] and events[-1] == "data: [DONE]"
        assert "injected failure" not in bad_stream_r.text
        request_id = message.split("request id ")[1].split(")")[0]
        assert any(request_id in rec.getMessage() and "injected failure" in rec.getMessage() for rec in caplog.records)
        assert (await c.get("/health")).status_code == 200
    wait_idle(replica)


@pytest.fixture
def fake_replica(stories_path):
    """A replica with a model-free runner: for HTTP behaviour that does not depend on the model."""
    runner = FakeModelRunner(num_kv_blocks=128, vocab_size=512, max_model_len=512)
    config = EngineConfig(model=str(stories_path))
    runtime = ReplicaRuntime.start(config, ReplicaServerConfig(port=0, event_port=None, api_key="sekrit-key",
                                                               served_model_name="tiny"), model_runner=runner)
    yield runtime
    runtime.shutdown(graceful_s=0)


@pytest.fixture
def slow_fake_replica(fake_replica, monkeypatch):
    """``fake_replica`` whose steps take >= 5 ms, so a request of a few hundred tokens is surely still
    running when a test acts on it."""
    runner = fake_replica.llm.runner
    real_execute = runner.execute_model

    def slow_execute(out):
        time.sleep(0.005)
        return real_execute(out)

    monkeypatch.setattr(runner, "execute_model", slow_execute)
    return fake_replica


def test_api_key_guards_v1_routes_only(fake_replica):
    with httpx.Client(base_url=fake_replica.http.url, timeout=30) as c:
        req = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            r = c.post("/v1/completions", json=req, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        assert c.get("/v1/models").status_code == 401
        ok = c.post("/v1/completions", json=req, headers={"Authorization": "Bearer sekrit-key"})
        assert ok.status_code == 200 and ok.json()["model"] == "tiny"
        assert c.get("/health").status_code == 200 and c.get("/metrics").status_code == 200


async def test_graceful_shutdown_finishes_in_flight_and_refuses_new(slow_fake_replica):
    fake_replica = slow_fake_replica  # 200 tokens take >= 1 s: the shutdown surely finds the request running
    url, headers = fake_replica.http.url, {"Authorization": "Bearer sekrit-key"}
    async with httpx.AsyncClient(base_url=url, timeout=30, headers=headers) as c:
        slow = asyncio.ensure_future(c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 200,
                                                                     "ignore_eos": True}))
        deadline = time.monotonic() + 10
        while fake_replica.llm.num_unfinished() == 0:  # wait for the request to be running
            assert not slow.done(), slow.result().text
            assert time.monotonic() < deadline, "the request never started running"
            await asyncio.sleep(0.01)
        done = asyncio.get_running_loop().run_in_executor(None, fake_replica.shutdown, 10.0)
        deadline = time.monotonic() + 10  # the shutdown runs on another thread: wait for it to begin
        while fake_replica.llm.dead_reason() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert fake_replica.llm.dead_reason() == "shutting down"
        r = await slow
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 200
        assert await done is True


def test_broken_tp_group_makes_health_and_new_requests_503(fake_replica):
    fake_replica.llm.runner.dead_reason = "a rank failed a step: RayActorError"
    with httpx.Client(base_url=fake_replica.http.url, timeout=30,
                      headers={"Authorization": "Bearer sekrit-key"}) as c:
        health = c.get("/health")
        assert health.status_code == 503 and "rank failed" in health.json()["error"]["message"]
        assert "RayActorError" not in health.text  # the exception is the log's, not the answer's
        r = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        assert r.status_code == 503 and r.json()["error"]["code"] == 503
        assert "RayActorError" not in r.text and "request id" in r.json()["error"]["message"]
    assert fake_replica.broken_reason() is not None


async def test_drain_timeout_aborts_in_flight_streams(slow_fake_replica):
    fake_replica = slow_fake_replica  # 500 tokens take >= 2.5 s: the drain surely finds the stream running
    url, headers = fake_replica.http.url, {"Authorization": "Bearer sekrit-key"}
    async with httpx.AsyncClient(base_url=url, timeout=30, headers=headers) as c:
        req = {"prompt": "hi", "max_tokens": 500, "ignore_eos": True, "stream": True}
        async with c.stream("POST", "/v1/completions", json=req) as r:
            lines = r.aiter_lines()
            await lines.__anext__()
            done = asyncio.get_running_loop().run_in_executor(None, fake_replica.shutdown, 0.0)
            rest = [line async for line in lines if line.startswith("data: ")]
        assert await done is False
    assert rest[-1] == "data: [DONE]"
    assert json.loads(rest[-2][6:])["choices"][0]["finish_reason"] == "abort"
