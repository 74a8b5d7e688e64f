"""Faults: a replica killed mid-run, a router restart, bad input, no healthy replica, auth."""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from kvmesh.router.config import ReplicaSpec, RouterConfig
from kvmesh.router.control.router_server import RouterServer

from .conftest import BLOCK_SIZE, wait_for
from .test_router_http import complete, prompt


def test_killed_replica_is_retried_avoided_and_rejoins_empty(fakes, start_router):
    by_name = {f.name: f for f in fakes}
    router = start_router([f.spec for f in fakes])
    core = router.runtime.router
    # A prefix no other test sends (the fake replicas live for the whole session, so prompt(10)'s 64 tokens
    # may already be cached on both), long enough that the two requests below prefer the holder by far:
    # the idle replica must compute all ~164 tokens, the holder 4 beyond its cached blocks.
    base = prompt(4101, 160)
    holder = complete(router, base)["choices"][0]["text"]
    other = "b" if holder == "a" else "a"
    wait_for(lambda: core.index.num_blocks(holder) >= len(base) // BLOCK_SIZE, what="events")

    by_name[holder].configure(delay=30)  # holds requests before their first byte
    with ThreadPoolExecutor(2) as pool:
        in_flight = [pool.submit(complete, router, base + [7, 7, 7, i]) for i in range(2)]
        wait_for(lambda: core.loads.loads[holder].in_flight == 2, what="requests in flight on the holder")
        by_name[holder].kill()
        outs = [f.result(timeout=20) for f in in_flight]
    assert {o["choices"][0]["text"] for o in outs} == {other}  # retried elsewhere, no error
    assert holder not in core.healthy
    assert complete(router, base)["choices"][0]["text"] == other  # new requests avoid it
    wait_for(lambda: core.index.num_blocks(holder) == 0, what="the dead replica's tree to be dropped")

    by_name[holder].launch().wait_ready()  # same ports: a new incarnation
    wait_for(lambda: holder in core.healthy, what="the restarted replica to be probed back")
    assert core.index.num_blocks(holder) == 0
    by_name[other].configure(delay=0, status=503)  # now only the rejoined replica can answer
    assert complete(router, prompt(11))["choices"][0]["text"] == holder


def test_router_restart_rebuilds_index_from_snapshots(fakes, start_router):
    first = start_router([f.spec for f in fakes])
    base = prompt(20, 80)
    holder = complete(first, base)["choices"][0]["text"]
    wait_for(lambda: first.runtime.router.index.num_blocks(holder) >= 20, what="events")
    first.stop()

    second = start_router([f.spec for f in fakes])  # new process state, new key seed
    wait_for(lambda: second.runtime.router.index.num_blocks(holder) >= 20, what="snapshot")
    out = complete(second, base + [5, 5, 5, 5])
    assert out["choices"][0]["text"] == holder
    assert out["usage"]["prompt_tokens_details"]["cached_tokens"] == len(base)
    reg = second.runtime.metrics.registry
    assert reg.get_sample_value("kvmesh_router_predicted_hit_tokens_total", {"replica": holder}) == len(base)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_no_healthy_replica_gives_503(start_router):
    router = start_router([ReplicaSpec(f"http://127.0.0.1:{_free_port()}", replica_id="dead")])
    health = httpx.get(router.url + "/health")
    assert health.status_code == 503
    r = httpx.post(router.url + "/v1/completions", json={"prompt": "Once upon a time"})
    assert r.status_code == 503
    err = r.json()["error"]
    assert err["code"] == 503 and err["type"] == "service_unavailable" and "replica" in err["message"]


AUTH = {"content-type": "application/json", "Authorization": "Bearer sekret-key"}


@pytest.fixture(scope="module")
def keyed_router(tokenizer):
    """One router without replicas, with an API key and a served model name."""
    cfg = RouterConfig(port=0, block_size=BLOCK_SIZE, api_key="sekret-key", served_model_name="stories")
    server = RouterServer(cfg, [], tokenizer=tokenizer).start()
    yield server
    server.stop()


@pytest.mark.parametrize("body, status, param", [
    (b"{not json", 400, None),
    (b"[1, 2]", 400, None),
    (b'{"max_tokens": 4}', 400, None),                                   # no prompt
    (b'{"prompt": "hi", "max_tokens": 0}', 400, "max_tokens"),
    (b'{"prompt": "hi", "max_tokens": 100000}', 400, "max_tokens"),
    (b'{"prompt": "hi", "temperature": -1}', 400, None),
    (b'{"prompt": [' + b"5," * 600 + b'5]}', 400, "prompt"),              # longer than the context
    (b'{"prompt": "hi", "model": "gpt-9"}', 404, "model"),
])
def test_bad_input_gets_openai_shaped_4xx(keyed_router, body, status, param):
    router = keyed_router
    r = httpx.post(router.url + "/v1/completions", content=body, headers=AUTH)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == status and err["message"] and err["type"]
    if param:
        assert err["param"] == param


def test_bad_chat_messages_get_400(keyed_router):
    r = httpx.post(keyed_router.url + "/v1/chat/completions", json={"messages": []}, headers=AUTH)
    assert r.status_code == 400 and "messages" in r.json()["error"]["message"]


def test_api_key_guards_v1_but_not_health(keyed_router):
    router = keyed_router
    assert httpx.post(router.url + "/v1/completions", json={"prompt": "x"}).status_code == 401
    wrong = httpx.post(router.url + "/v1/completions", json={"prompt": "x"},
                       headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == 401
    ok = httpx.get(router.url + "/v1/models", headers={"Authorization": "Bearer sekret-key"})
    assert ok.status_code == 200 and ok.json()["data"]
    assert httpx.get(router.url + "/health").status_code == 503  # open, but no replica
    assert httpx.get(router.url + "/metrics").status_code == 200


def test_unknown_route_is_openai_shaped_404(keyed_router):
    r = httpx.get(keyed_router.url + "/v1/nothing", headers=AUTH)
    assert r.status_code == 404 and r.json()["error"]["code"] == 404


def test_router_binds_loopback_by_default(keyed_router):
    router = keyed_router
    assert router.config.host == "127.0.0.1" and router.url.startswith("http://127.0.0.1:")


def test_replica_5xx_is_retried_elsewhere_and_load_accounting_stays_exact(fakes, start_router):
    a, b = fakes
    router = start_router([a.spec, b.spec], upstream={"max_attempts": 2})
    core = router.runtime.router
    a.configure(status=503)
    outs = {complete(router, prompt(30 + i))["choices"][0]["text"] for i in range(3)}
    assert outs == {"b"}
    b.configure(status=500)  # both fail: the last replica's error is passed through
    r = httpx.post(router.url + "/v1/completions", json={"prompt": prompt(40)}, timeout=20)
    assert r.status_code in (500, 503) and "error" in r.json()
    assert all(load.in_flight == 0 and load.pending_prefill_tokens == 0 for load in core.loads.loads.values())


def test_a_whole_answer_cut_mid_body_is_tried_on_another_replica(fakes, start_router):
    # Nothing of a non-streamed answer reaches the client before its end: a replica dying half-way through
    # it costs a retry, not a 502 carrying the connection's error.
    a, b = fakes
    router = start_router([a.spec, b.spec], upstream={"max_attempts": 2})
    a.configure(cut=True)
    for i in range(4):
        r = httpx.post(router.url + "/v1/completions", json={"prompt": prompt(60 + i), "max_tokens": 3},
                       headers={"x-kvmesh-receipt": "1"}, timeout=20)
        assert r.status_code == 200, r.text
        assert r.headers["x-kvmesh-replica"] == "b"
    failures = router.runtime.metrics.registry.get_sample_value("kvmesh_router_replica_failures_total",
                                                                 {"replica": "a", "kind": "reset"})
    assert failures, "the cut replica was never tried"


@pytest.mark.parametrize("body, completion", [
    ({"prompt": "hi", "max_tokens": 100000}, 100000),
    ({"prompt": [5] * 601}, 16),  # the prompt alone overflows; a completion's max_tokens is 16 unless sent
])
def test_a_context_overflow_is_worded_as_vllm_words_it(keyed_router, tokenizer, body, completion):
    """Clients (lm-eval, agent frameworks) recognise vLLM's sentence; kvmesh's advice follows it."""
    r = httpx.post(keyed_router.url + "/v1/completions", json=body, headers=AUTH)
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    context = tokenizer.max_model_len
    assert message.startswith(f"This model's maximum context length is {context} tokens. However, you requested "
                              f"{completion} output tokens and your prompt contains at least "), message
    assert "Please reduce the length of the input prompt or the number of requested output tokens." in message
