"""A hostile tenant against the router's identity and priority (router/http/caller.py, router/admission/tenants.py):
a real router with a keys file and its own API key in front of fake replicas that report their scheduling policy in
``/load`` and record the ``priority`` of every completion they get (cluster/measure/benchmarks/support/fake_replica.py).

The credentials alone say who a request is: the router's own key is one shared tenant whatever ``user`` it names,
so it cannot be booked as a keyed tenant or drain that tenant's bucket; every caller's priority is clamped, and
the clamped one is what reaches a replica that schedules by priority, on every leg (the request, a retry, a P/D
prefill call, a stream's continuation), through the body or the header. Seconds each.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest
from kvmesh.replica.openai.sampling_fields import PRIORITY_LIMIT
from kvmesh.router.admission.config import AdmissionConfig
from kvmesh.router.config import RouterConfig, UpstreamConfig
from kvmesh.router.control.router_server import RouterServer
from kvmesh.router.routing.kv_placement import KVPlacementRules

from ..conftest import CHAT_TEMPLATE
from ..router.conftest import ADMIN_KEY, BLOCK_SIZE, fake_stats, launched_fakes, wait_for
from ..router.test_router_http import prompt

SHARED = "sk-the-routers-own-key-0123"
KEYS = {"light": "sk-light-0123456789", "light-2": "sk-light-second-0123", "batch": "sk-batch-0123456789"}
KEYS_FILE = (f"keys:\n  - {{key: {KEYS['light']}, tenant: light, tokens_per_s: 0.5, burst_tokens: 120}}\n"
             f"  - {{key: {KEYS['light-2']}, tenant: light, tokens_per_s: 0.5, burst_tokens: 120}}\n"
             f"  - {{key: {KEYS['batch']}, tenant: batch, priority: 10, min_priority: 10}}\n")
TRANSFER = {"enabled": True, "pull_bytes_per_s": 1e9, "bytes_per_token": 64}


@pytest.fixture(scope="module")
def tokenizer(stories_path):
    from kvmesh.replica.serving.tokenizer import load_tokenizer

    return load_tokenizer(stories_path, chat_template=CHAT_TEMPLATE)


@pytest.fixture(scope="module")
def _fakes():
    with launched_fakes("a", "b") as procs:
        yield procs


@pytest.fixture
def fakes(_fakes):
    """Fakes "a" and "b", both scheduling by priority, KV transfer on (one may be a P/D split's prefill replica)."""
    for p in _fakes:
        p.configure(delay=0, status=200, cut=False, reset_stats=True, scheduling_policy="priority",
                    prefill_tokens_per_s=1000.0, kv_transfer=TRANSFER)
    yield _fakes
    for p in _fakes:
        p.configure(cut=False, status=200, scheduling_policy="", reset_stats=True)


@pytest.fixture
def start_router(tokenizer, tmp_path):
    started: list[RouterServer] = []

    def start(specs, admission: dict | None = None, **kw) -> RouterServer:
        keys = tmp_path / "keys.yaml"
        keys.write_text(KEYS_FILE)
        cfg = RouterConfig(port=0, block_size=BLOCK_SIZE, admin_key=ADMIN_KEY, api_key=SHARED,
                           upstream=UpstreamConfig(poll_interval_s=0.05, connect_timeout_s=1.0),
                           admission=AdmissionConfig(keys_file=str(keys), **(admission or {})), **kw)
        server = RouterServer(cfg, specs, tokenizer=tokenizer).start()
        started.append(server)
        loads = server.runtime.router.loads.loads
        wait_for(lambda: all(loads[s.replica_id].scheduling_policy == "priority" for s in specs),
                 what="the replicas' scheduling policy learned from /load")
        return server

    yield start
    for s in started:
        s.stop()


def _post(router, key: str, body: dict, headers: dict | None = None, chat: bool = False) -> httpx.Response:
    path = "/v1/chat/completions" if chat else "/v1/completions"
    return httpx.post(router.url + path, json={"max_tokens": 2, **body}, timeout=30,
                      headers={"Authorization": f"Bearer {key}", **(headers or {})})


def _seen(*fakes) -> list:
    return [p for f in fakes for p in fake_stats(f)["priorities_seen"]]


ASKS = [({"priority": -1000}, {}), ({}, {"x-kvmesh-priority": "-1000"}),
        ({"priority": 5}, {"x-kvmesh-priority": "-1000"}), ({}, {})]
PATHS = [("completion", {"prompt": "Once upon a time"}, False),
         ("stream", {"prompt": "Once upon a time", "stream": True}, False),
         ("chat", {"messages": [{"role": "user", "content": "hi"}]}, True)]


@pytest.mark.parametrize("path", PATHS, ids=[p[0] for p in PATHS])
def test_a_keyed_tenant_reaches_the_replica_at_its_floor_whatever_it_asks(fakes, start_router, path):
    a, _ = fakes
    router = start_router([a.spec])
    _, body, chat = path
    for extra, headers in ASKS:
        r = _post(router, KEYS["batch"], {**body, **extra}, headers, chat)
        assert r.status_code == 200, r.text
    assert _seen(a) == [10] * len(ASKS)  # -1000 asked by body or header, or nothing: its key's 10


def test_the_shared_key_is_clamped_and_cannot_pose_as_a_keyed_tenant(fakes, start_router):
    a, _ = fakes
    router = start_router([a.spec])
    for user in ("vip", "light", "batch"):
        r = _post(router, SHARED, {"prompt": "Once upon a time", "user": user, "priority": -1_000_000})
        assert r.status_code == 200, r.text
    assert _seen(a) == [0, 0, 0]  # the shared tenant's floor (0), not the asked -1000000
    usage, now = router.runtime.admission.admission.ledger.usage, time.monotonic()
    assert usage("light", now) == 0 and usage("vip", now) == 0 and usage("default", now) > 0


def test_no_tenant_drains_another_tenants_bucket(fakes, start_router):
    a, _ = fakes
    router = start_router([a.spec], admission={"tokens_per_s": 0.5, "burst_s": 240})  # others' buckets: 120 too
    long = {"prompt": "Once upon a time there was a little girl " * 6, "max_tokens": 4}  # ~70 tokens
    for key in (SHARED, KEYS["batch"]):  # posing as light by ``user``: booked to their own key's tenant
        for _ in range(3):
            _post(router, key, {**long, "user": "light"})
    assert _post(router, KEYS["light"], long).status_code == 200  # light's own bucket (120 tokens) is whole
    over = _post(router, KEYS["light"], long)  # ... and it is light's alone: now it is spent
    assert over.status_code == 429 and over.json()["error"]["type"] == "tenant_over_limit"


def test_a_tenant_with_many_keys_has_one_bucket(fakes, start_router):
    a, _ = fakes
    router = start_router([a.spec])
    long = {"prompt": "Once upon a time there was a little girl " * 6, "max_tokens": 4}  # ~70 tokens
    assert _post(router, KEYS["light"], long).status_code == 200  # light's bucket (120 tokens) now mostly spent
    over = _post(router, KEYS["light-2"], long)  # its second key is the same tenant: no second bucket
    assert over.status_code == 429 and over.json()["error"]["type"] == "tenant_over_limit", over.text
    assert "light" in over.json()["error"]["message"]


@pytest.mark.parametrize("second", [KEYS["light"], "bogus-key-0123456789", SHARED])
def test_two_authorization_headers_are_refused_whatever_the_second(fakes, start_router, second):
    """The check and the booking read the same credentials: a request with two keys is refused, never checked by
    one and booked to the other (which escaped its own bucket and priority onto the shared tenant or another)."""
    a, _ = fakes
    router = start_router([a.spec])
    headers = [("Authorization", f"Bearer {KEYS['batch']}"), ("Authorization", f"Bearer {second}")]
    for body in ({"prompt": "Once upon a time"}, {"prompt": "Once upon a time", "stream": True}):
        r = httpx.post(router.url + "/v1/completions", json={"max_tokens": 2, **body}, headers=headers, timeout=30)
        assert r.status_code == 400 and "one Authorization header" in r.json()["error"]["message"], r.text
    assert _seen(a) == []


def test_a_priority_out_of_range_is_a_400_naming_the_field(fakes, start_router):
    a, _ = fakes
    router = start_router([a.spec])
    for value in (PRIORITY_LIMIT + 1, -10**28, 10**100):
        r = _post(router, KEYS["light"], {"prompt": "x", "priority": value})
        assert r.status_code == 400 and "priority" in r.json()["error"]["message"], r.text
        r = _post(router, SHARED, {"prompt": "x"}, {"x-kvmesh-priority": str(value)})
        assert r.status_code == 400 and "x-kvmesh-priority" in r.json()["error"]["message"], r.text
    assert _seen(a) == []


def test_a_replica_that_does_not_schedule_by_priority_gets_no_priority(fakes, start_router):
    a, b = fakes
    router = start_router([a.spec])
    for policy in ("fcfs", ""):  # fcfs, or a replica that does not say (vLLM): a non-zero one would be refused
        a.configure(scheduling_policy=policy)
        wait_for(lambda policy=policy: router.runtime.router.loads.loads["a"].scheduling_policy == (policy or None),
                 what="the new policy learned")
        for headers in ({}, {"x-kvmesh-priority": "20"}):
            assert _post(router, KEYS["batch"], {"prompt": "x", "priority": 30}, headers).status_code == 200
    assert _seen(a) == [None] * 4


def test_a_retry_carries_the_granted_priority(fakes, start_router):
    a, b = fakes
    router = start_router([a.spec, b.spec])
    for f in fakes:
        f.configure(status=503)
    r = _post(router, KEYS["batch"], {"prompt": "x", "priority": -1000}, {"x-kvmesh-priority": "-1000"})
    assert r.status_code == 503
    assert len(_seen(a, b)) >= 2 and set(_seen(a, b)) == {10}  # both attempts


def test_a_stream_continuation_carries_the_granted_priority():
    # The fakes' streams carry no token ids, so they cannot migrate: the continuation the relay writes
    # (router/http/relay.py: ``ProxyRequest.continuation(..., stream.priority)``) is checked as it is sent.
    from kvmesh.router.http.proxy_request import ProxyRequest
    from kvmesh.router.http.token_forwarding import KVMESH

    body = {"prompt": [5, 6, 7], "stream": True, "priority": -1000}  # were a client's priority ever copied in
    leg = ProxyRequest.continuation(body, [5, 6, 7], None, priority=10)
    assert json.loads(leg.for_kind(KVMESH, by_priority=True))["priority"] == 10
    assert "priority" not in json.loads(leg.for_kind(KVMESH, by_priority=False))


def test_a_prefill_leg_carries_the_granted_priority(fakes, start_router):
    a, b = fakes
    spec_a, spec_b = a.spec, b.spec
    spec_a.role, spec_b.role = "prefill", "decode"
    router = start_router([spec_a, spec_b], transfers=KVPlacementRules(pd_min_uncached_tokens=32))
    r = _post(router, KEYS["batch"], {"prompt": prompt(7100), "priority": -1000}, {"x-kvmesh-receipt": "1"})
    assert r.status_code == 200 and r.headers["x-kvmesh-prefill-replica"] == "a", r.headers
    assert _seen(a) == [10] and _seen(b) == [10]  # the prefill call and the decode replica's request


def test_a_serve_replica_takes_tenants_only_through_the_router(kv_cluster):
    # A replica that took the tenants' key (or none) would serve them past the router's admission: its
    # limits, its clamped priority. Only the cluster's internal key, the router's, opens it.
    from .harness import DECODE

    c = kv_cluster
    body = c.completion_body([1, 2, 3, 4, 5], max_tokens=2)
    for who, headers in {"no key": {}, "tenant key": c.tenant(), "wrong key": {"Authorization": "Bearer nope"}}.items():
        r = httpx.post(c.replica_url(DECODE) + "/v1/completions", json=body, headers=headers, timeout=30)
        assert 400 <= r.status_code < 500 and "router" in r.json()["error"]["message"], (who, r.status_code, r.text)
    assert c.direct(DECODE, body).status_code == 200  # the router's own calls pass


@pytest.fixture(scope="module")
def engines(stories_path):
    """Two real stories260K replicas, under ``priority`` and ``fcfs``, each recording the priority its engine
    queues every request at (LLMEngine.add_request)."""
    from kvmesh.replica.config import EngineConfig
    from kvmesh.replica.runtime import ReplicaRuntime
    from kvmesh.replica.server.config import ReplicaServerConfig

    runtimes, seen = {}, {}
    try:
        for policy in ("priority", "fcfs"):
            config = EngineConfig(model=str(stories_path), kv_cache_memory=4 << 20, scheduling_policy=policy)
            rt = runtimes[policy] = ReplicaRuntime.start(config, ReplicaServerConfig(port=0, event_port=None))
            engine, seen[policy] = rt.llm.engine, []
            add = engine.add_request

            def record(engine_request, _add=add, _seen=seen[policy]):
                _seen.append(engine_request.priority)
                return _add(engine_request)

            engine.add_request = record
        yield runtimes, seen
    finally:
        for rt in runtimes.values():
            rt.shutdown(graceful_s=0.5)


@pytest.mark.parametrize("policy", ["priority", "fcfs"])
def test_the_engine_queues_a_request_at_the_priority_the_router_granted(engines, tokenizer, tmp_path, policy):
    from kvmesh.router.config import ReplicaSpec

    runtimes, seen = engines
    keys = tmp_path / "keys.yaml"
    keys.write_text(KEYS_FILE)
    cfg = RouterConfig(port=0, block_size=16, api_key=SHARED, upstream=UpstreamConfig(poll_interval_s=0.05),
                       admission=AdmissionConfig(keys_file=str(keys)))
    router = RouterServer(cfg, [ReplicaSpec(runtimes[policy].http.url, replica_id="r")], tokenizer=tokenizer).start()
    try:
        wait_for(lambda: router.runtime.router.loads.loads["r"].scheduling_policy == policy, what="/load's policy")
        seen[policy].clear()
        for key, asked in ((KEYS["batch"], -1000), (KEYS["batch"], None), (SHARED, -5)):
            r = _post(router, key, {"prompt": "Once upon a time", **({} if asked is None else {"priority": asked})})
            assert r.status_code == 200, r.text  # under fcfs a forwarded -1000 would be the replica's 400
        assert seen[policy] == ([10, 10, 0] if policy == "priority" else [0, 0, 0])
    finally:
        router.stop()
