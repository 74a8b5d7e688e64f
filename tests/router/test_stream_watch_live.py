"""Exact or explicitly degraded, end to end: fake replica processes with real ZeroMQ
publishers behind a real router. A replica whose publisher stops while its HTTP keeps serving, or
whose events arrive late, is degraded -- visibly (/replicas, /metrics, /health, `kvmesh status`) --
and routed by load only; it is exact again once its stream is back. An idle replica never is."""

from __future__ import annotations

import re
import time

import httpx
import pytest
from kvmesh.cluster.commands.status import format_table
from kvmesh.cluster.router_client import RouterClient
from kvmesh.events.config import SubscriberConfig
from kvmesh.router.config import ReplicaSpec, RouterConfig, UpstreamConfig
from kvmesh.router.control.router_server import RouterServer

from .conftest import ADMIN_KEY, FakeProc, replica_rows, wait_for

MAX_LAG_S = 1.5
PROMPT = list(range(10, 42))  # 8 full blocks of 4 tokens
AFTER_STOP = [list(range(100 + 40 * i, 132 + 40 * i)) for i in range(3)]


@pytest.fixture
def pair():
    """Two fake replicas of this module's own (tests here stop their publishers and skew their clocks)."""
    procs = [FakeProc(name).launch() for name in ("s1", "s2")]
    try:
        yield [p.wait_ready() for p in procs]
    finally:
        for p in procs:
            p.kill()


def direct(fake: FakeProc, prompt: list[int]) -> None:
    """A request straight to the replica (not through the router): its cache changes, its events go out."""
    r = httpx.post(fake.info["url"] + "/v1/completions", json={"model": "m", "prompt": prompt, "max_tokens": 2},
                   timeout=10)
    r.raise_for_status()


def matched(runtime, other: str, prompt: list[int]) -> int:
    """Blocks of ``prompt`` the routing decision credits the replica that is not ``other`` with."""
    return runtime.router.route(prompt, exclude=[other]).matched_blocks


def test_a_stopped_publisher_degrades_its_replica_until_it_is_back(pair, start_router):
    a, b = pair
    router = start_router([a.spec, b.spec], events=SubscriberConfig(max_lag_s=MAX_LAG_S))
    rt = router.runtime
    wait_for(lambda: rt.router.healthy == {"s1", "s2"}, what="replicas healthy")
    direct(a, PROMPT)
    wait_for(lambda: rt.router.index.num_blocks("s1") == 8, what="s1's blocks in the index")
    time.sleep(2 * MAX_LAG_S)  # what must not happen (an absence): idle past events_max_lag_s is not a stall
    assert rt.router.degraded == {}
    assert matched(rt, "s2", PROMPT) == 8

    a.configure(publisher="stop")  # its publisher is dead; HTTP keeps serving
    for prompt in AFTER_STOP:
        direct(a, prompt)
    # Both show it: its connection dropped (the I/O thread closed the socket), its batches wait unsent.
    wait_for(lambda: all(why in (rt.router.degraded.get("s1") or "") for why in (
        "stalled: no connection to its publisher", "publisher has not sent its batches")), timeout=15,
        what="s1 degraded")
    assert "s2" not in rt.router.degraded
    decision = rt.router.route(PROMPT, exclude=["s2"])
    assert decision.matched_blocks == 0 and decision.receipt.reason == "fallback"  # no stale match claimed
    listed = {r["id"]: r for r in replica_rows(router)}
    assert "event stream stalled" in listed["s1"]["degraded"] and listed["s2"]["degraded"] is None
    health = httpx.get(router.url + "/health", timeout=5).json()
    assert list(health["degraded_replicas"]) == ["s1"] and health["status"] == "ok"  # still served, by load
    metrics = httpx.get(router.url + "/metrics", timeout=5).text
    assert 'kvmesh_router_replica_degraded{reason="stalled",replica="s1"} 1.0' in metrics
    assert 'kvmesh_router_replica_degraded{reason="stalled",replica="s2"} 0.0' in metrics
    client = RouterClient(router.url, admin_key=ADMIN_KEY)
    try:
        table = format_table(client.status(), router.url, client.health())
    finally:
        client.close()
    assert "s1: routed by load only -- event stream stalled" in table

    a.configure(publisher="restart")  # a new publisher on the same ports: the router resyncs from it
    wait_for(lambda: "s1" not in rt.router.degraded, timeout=15, what="s1 exact again")
    wait_for(lambda: rt.router.index.num_blocks("s1") == 32, what="the blocks cached meanwhile, from a snapshot")
    assert matched(rt, "s2", AFTER_STOP[-1]) == 8
    assert 'reason="stalled",replica="s1"} 0.0' in httpx.get(router.url + "/metrics", timeout=5).text


def test_late_events_degrade_with_a_reason_and_a_skewed_clock_is_not_lateness(pair, start_router):
    a, b = pair
    router = start_router([a.spec, b.spec], events=SubscriberConfig(max_lag_s=MAX_LAG_S))
    rt = router.runtime
    wait_for(lambda: rt.router.healthy == {"s1", "s2"}, what="replicas healthy")
    b.configure(clock_skew=-30.0)  # its clock is 30 s behind: its batches look 30 s old, they are not
    s2 = rt.replicas.get("s2").stream
    wait_for(lambda: s2.clock_offset < -29,
             what="the router to learn s2's clock offset from its /load")
    direct(b, PROMPT)
    wait_for(lambda: rt.router.index.num_blocks("s2") == 8, what="s2's blocks in the index")
    time.sleep(MAX_LAG_S)  # what must not happen (an absence): for events_max_lag_s, no lag and no stall
    assert rt.router.degraded == {}

    b.configure(event_lag=3 * MAX_LAG_S)  # its events now reach the router 4.5 s after they happened
    direct(b, AFTER_STOP[0])
    wait_for(lambda: "s2" in rt.router.degraded, what="s2 degraded")
    lagging = re.search(r"event stream lagging: a batch applied (\d+\.\d)", rt.router.degraded["s2"])
    assert lagging and float(lagging[1]) >= 3 * MAX_LAG_S - 0.5, rt.router.degraded["s2"]  # late, however loaded
    assert matched(rt, "s1", PROMPT) == 0
    assert "s1" not in rt.router.degraded

    b.configure(event_lag=0.0)
    direct(b, AFTER_STOP[1])
    wait_for(lambda: "s2" not in rt.router.degraded, what="s2 exact again")
    assert matched(rt, "s1", PROMPT) == 8


@pytest.mark.slow
def test_a_real_replica_reports_its_stream_and_is_degraded_when_its_publisher_dies(stories_path, tokenizer):
    """A stories260K replica (real engine and publisher): its /load says which batch it sent last, which
    the router has applied while the stream flows (idle or not: never degraded); once its publisher's
    I/O thread is gone the batches of new requests stay unsent and the router degrades it."""
    from ..replica.stories_replica import stories_replica

    with stories_replica(stories_path) as replica:
        spec = ReplicaSpec(replica.http.url, replica.endpoints()["events_endpoint"],
                           replica.endpoints()["replay_endpoint"], replica_id="real")
        router = RouterServer(RouterConfig(port=0, block_size=16, upstream=UpstreamConfig(poll_interval_s=0.1),
                                           events=SubscriberConfig(max_lag_s=MAX_LAG_S)),
                              [spec], tokenizer=tokenizer).start()
        try:
            rt = router.runtime
            wait_for(lambda: rt.router.healthy == {"real"}, what="replica healthy")
            story = {"prompt": "Once upon a time, there was a little girl named Lily. " * 4,
                     "max_tokens": 3}
            assert httpx.post(router.url + "/v1/completions", json=story, timeout=30).status_code == 200
            load = httpx.get(replica.http.url + "/load", timeout=5).json()
            assert load["kv_events_seq"] >= 0 and load["kv_events_unsent_s"] == 0.0
            stats = lambda: rt.subscriber.stats.get("real")  # noqa: E731 (a fresh view each call)
            wait_for(lambda: stats() is not None and stats().last_seq == load["kv_events_seq"],
                     what="the router caught up")
            time.sleep(2 * MAX_LAG_S)  # what must not happen (an absence): idle past events_max_lag_s, not degraded
            assert rt.router.degraded == {}

            replica.publisher._io.stop()  # its publisher dies; HTTP and engine keep serving
            replica.publisher._thread.join(5)
            other = {**story, "prompt": "The dog ran to the park to play with a big ball. " * 4}
            assert httpx.post(replica.http.url + "/v1/completions", json=other, timeout=30).status_code == 200
            wait_for(lambda: "publisher has not sent its batches" in (rt.router.degraded.get("real") or ""),
                     timeout=15, what="degraded")
            assert httpx.get(replica.http.url + "/load", timeout=5).json()["kv_events_unsent_s"] > MAX_LAG_S
        finally:
            router.stop()


def test_request_bodies_are_never_charged_to_the_replicas_event_streams(pair, start_router):
    """48 rejected 10 MB request bodies in 0.7 s grew the router by ~500 MB, and its watch of the
    process's RSS cut both healthy replicas' event streams ("a message that never ends?"). What ZeroMQ
    holds is counted per connection now: the streams never notice the bodies."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    a, b = pair
    router = start_router([a.spec, b.spec])
    rt = router.runtime
    wait_for(lambda: rt.router.healthy == {"s1", "s2"}, what="replicas healthy")
    wait_for(lambda: all(rt.subscriber.disconnected_s(n) is None for n in ("s1", "s2")), what="streams connected")

    def rss() -> int:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * 4096

    start, peak, done = rss(), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss())
            done.wait(0.01)

    body = b"{" + b" " * (10 << 20)  # not JSON: read whole, then refused
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    with ThreadPoolExecutor(48) as pool:
        codes = list(pool.map(lambda _: httpx.post(router.url + "/v1/completions", content=body, timeout=60,
                                                   headers={"content-type": "application/json"}).status_code,
                              range(48)))
    done.set()
    sampler.join()
    assert set(codes) == {400}
    assert peak[0] - start > 200 << 20  # the premise: the bodies made the process grow
    direct(a, PROMPT)  # and the stream still flows
    wait_for(lambda: rt.router.index.num_blocks("s1") == 8, what="s1's blocks in the index")
    for name in ("s1", "s2"):
        st = rt.subscriber.stats[name]
        assert st.bad_frames == 0 and st.reconnects == 0 and st.degradations == 0, (name, st)
    assert rt.router.degraded == {}
