"""A stream whose replica dies mid-way goes on from another replica: one uninterrupted stream for the client.

Two live kvmesh replicas serve stories260K; each sits behind a proxy, and the first proxy to carry a
given number of SSE events dies (resets its connections, refuses new ones) as a killed replica does.
The reference is the same request answered by one replica alone, without any death.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from kvmesh.router.config import ReplicaSpec, RouterConfig, UpstreamConfig
from kvmesh.router.control.router_server import RouterServer

from .conftest import wait_for
from .dying_proxy import DyingProxy, Fuse

pytestmark = pytest.mark.slow

STORY = ("Once upon a time, there was a little girl named Lily. She loved to play in the park with her "
         "big red ball. One day, she saw a dog in the park and")


@pytest.fixture(scope="module")
def replicas(stories_path):
    from kvmesh.replica.config import EngineConfig
    from kvmesh.replica.openai.config import FrontendConfig
    from kvmesh.replica.runtime import ReplicaRuntime
    from kvmesh.replica.server.config import ReplicaServerConfig

    from ..conftest import CHAT_TEMPLATE

    runtimes = []
    try:
        for _ in range(2):
            config = EngineConfig(model=str(stories_path), kv_cache_memory=4 << 20, max_num_seqs=32)
            runtimes.append(ReplicaRuntime.start(config, ReplicaServerConfig(port=0, event_port=0, replay_port=0),
                                                 frontend=FrontendConfig(chat_template=CHAT_TEMPLATE)))
        yield runtimes
    finally:
        for rt in runtimes:
            rt.shutdown(graceful_s=0.5)


@pytest.fixture
def cluster(replicas, tokenizer):
    """(router, proxies, fuse): a fresh router whose replicas are reached through dying proxies."""
    fuse = Fuse(after_events=10**9)
    proxies = [DyingProxy(f"p{i}", int(rt.http.url.rsplit(":", 1)[1]), fuse) for i, rt in enumerate(replicas)]
    specs = [ReplicaSpec(p.url, rt.endpoints()["events_endpoint"], rt.endpoints()["replay_endpoint"],
                         replica_id=p.name) for p, rt in zip(proxies, replicas, strict=True)]
    router = RouterServer(RouterConfig(port=0, block_size=16, upstream=UpstreamConfig(poll_interval_s=0.2)),
                          specs, tokenizer=tokenizer).start()
    wait_for(lambda: len(router.runtime.router.healthy) == 2, what="both replicas healthy")
    yield router, proxies, fuse
    router.stop()
    for p in proxies:
        p.close()


def stream(url: str, path: str, body: dict) -> list[dict | str]:
    """Every event of a streamed request, decoded ("[DONE]" as the string)."""
    events = []
    with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: "):
                data = line[6:]
                events.append(data if data == "[DONE]" else json.loads(data))
    return events


def text_of(events: list, chat: bool) -> str:
    parts = []
    for e in events:
        if isinstance(e, dict) and e.get("choices"):
            choice = e["choices"][0]
            parts.append((choice["delta"].get("content") or "") if chat else choice["text"])
    return "".join(parts)


def check_one_stream(events: list, chat: bool) -> None:
    """One id, no error, one finish, ``[DONE]`` last."""
    assert events[-1] == "[DONE]", events[-3:]
    chunks = events[:-1]
    assert not [e for e in chunks if "error" in e], [e for e in chunks if "error" in e]
    assert len({e["id"] for e in chunks}) == 1
    assert len({e["created"] for e in chunks}) == 1
    finishes = [e["choices"][0]["finish_reason"] for e in chunks if e.get("choices")]
    assert [f for f in finishes if f] == [finishes[-1]] and finishes[-1] in ("stop", "length")
    assert all("token_ids" not in e["choices"][0] for e in chunks if e.get("choices")), "router-only field leaked"
    assert all(e["object"] == ("chat.completion.chunk" if chat else "text_completion") for e in chunks)


def migrations(router) -> float:
    reg = router.runtime.metrics.registry
    return sum(reg.get_sample_value("kvmesh_router_stream_migrations_total", {"replica": p}) or 0
               for p in ("p0", "p1"))


def reference(replicas, path: str, body: dict) -> list:
    """The same request answered by one replica alone (no death)."""
    return stream(replicas[1].http.url, path, body)


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": STORY, "max_tokens": 48, "temperature": 0}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": STORY}], "max_tokens": 48, "temperature": 0}),
    ("/v1/completions", {"prompt": STORY, "max_tokens": 48, "temperature": 1.0, "seed": 1234}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": STORY}], "max_tokens": 48, "temperature": 0,
                              "structured_outputs": {"regex": "( [a-z]+){48,}"}}),
], ids=["completion-greedy", "chat-greedy", "completion-seeded", "chat-structured"])
def test_stream_continues_on_another_replica_with_the_same_text(cluster, replicas, path, body):
    router, proxies, fuse = cluster
    chat = "chat" in path
    body = {**body, "ignore_eos": True, "stream_options": {"include_usage": True}}
    expected = reference(replicas, path, body)
    fuse.after_events = fuse.events + 12  # dies after ~a quarter of the stream
    events = stream(router.url, path, body)
    assert fuse.blown_by is not None, "the proxy never died: the test did not test anything"
    check_one_stream(events, chat)
    assert text_of(events, chat) == text_of(expected, chat)
    usage = [e["usage"] for e in events[:-1] if e.get("usage")]
    assert len(usage) == 1 and usage[0]["completion_tokens"] == 48
    assert usage[0]["prompt_tokens"] == expected[-2]["usage"]["prompt_tokens"]
    assert migrations(router) == 1


def logprob_tokens(events: list, chat: bool) -> list[tuple[str, float, int]]:
    """(token, logprob, top_logprobs count) of every token the stream's logprobs name, in order."""
    out = []
    for e in events:
        if isinstance(e, dict) and e.get("choices") and (lp := e["choices"][0].get("logprobs")):
            if chat:
                out += [(t["token"], t["logprob"], len(t["top_logprobs"])) for t in lp["content"]]
            else:
                out += list(zip(lp["tokens"], lp["token_logprobs"], map(len, lp["top_logprobs"]), strict=True))
    return out


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": STORY, "logprobs": 2}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": STORY}], "logprobs": True, "top_logprobs": 2}),
], ids=["completion", "chat"])
def test_a_migrated_stream_keeps_its_penalties_min_p_and_logprobs(cluster, replicas, path, body):
    router, proxies, fuse = cluster
    chat = "chat" in path
    body = {**body, "max_tokens": 40, "temperature": 0, "ignore_eos": True, "repetition_penalty": 1.3,
            "min_p": 0.05}
    expected = reference(replicas, path, body)
    fuse.after_events = fuse.events + 12
    events = stream(router.url, path, body)
    assert fuse.blown_by is not None and migrations(router) == 1
    check_one_stream(events, chat)
    assert text_of(events, chat) == text_of(expected, chat)  # the penalty shaped the continuation as it did alone
    got, want = logprob_tokens(events, chat), logprob_tokens(expected, chat)
    assert [(t, n) for t, _, n in got] == [(t, n) for t, _, n in want] and len(got) == 40
    assert [lp for _, lp, _ in got] == pytest.approx([lp for _, lp, _ in want], abs=1e-3)
    if not chat:
        assert text_offsets(events) == text_offsets(expected)


def text_offsets(events: list) -> list[int]:
    return [o for e in events[:-1] if e.get("choices") and (lp := e["choices"][0].get("logprobs"))
            for o in lp["text_offset"]]


def test_stop_string_across_the_splice_is_found(cluster, replicas):
    router, proxies, fuse = cluster
    body = {"prompt": STORY, "max_tokens": 48, "temperature": 0, "ignore_eos": True}
    full = text_of(reference(replicas, "/v1/completions", body), chat=False)
    stop = full[len(full) // 3:len(full) // 3 + 8]  # lies about where the proxy dies
    expected = reference(replicas, "/v1/completions", {**body, "stop": [stop]})
    assert expected[-2]["choices"][0]["finish_reason"] == "stop"
    fuse.after_events = fuse.events + len(full) // 3 // 4  # a few tokens before the stop string
    events = stream(router.url, "/v1/completions", {**body, "stop": [stop]})
    assert fuse.blown_by is not None
    check_one_stream(events, chat=False)
    assert events[-2]["choices"][0]["finish_reason"] == "stop"
    assert text_of(events, chat=False) == text_of(expected, chat=False)


def test_concurrent_streams_survive_a_replica_death_under_load(cluster, replicas):
    router, proxies, fuse = cluster
    bodies = [{"prompt": f"{STORY} {name} said", "max_tokens": 32, "temperature": 0, "ignore_eos": True}
              for name in ("Tom", "Sue", "Max", "Ann", "Ben", "Kim", "Sam", "Zoe")]
    expected = [text_of(reference(replicas, "/v1/completions", b), chat=False) for b in bodies]
    fuse.after_events = fuse.events + 40  # dies while several streams run
    with ThreadPoolExecutor(len(bodies)) as pool:
        results = list(pool.map(lambda b: stream(router.url, "/v1/completions", b), bodies))
    assert fuse.blown_by is not None
    for events, want in zip(results, expected, strict=True):
        check_one_stream(events, chat=False)
        assert text_of(events, chat=False) == want
    assert migrations(router) >= 1
    reg = router.runtime.metrics.registry
    assert (reg.get_sample_value("kvmesh_router_requests_total", {"status": "5xx"}) or 0) == 0


def test_stream_that_stalls_moves_to_another_replica_after_the_idle_deadline(replicas, tokenizer):
    fuse = Fuse(after_events=10**9, stall=True)
    proxies = [DyingProxy(f"p{i}", int(rt.http.url.rsplit(":", 1)[1]), fuse) for i, rt in enumerate(replicas)]
    specs = [ReplicaSpec(p.url, replica_id=p.name) for p in proxies]
    router = RouterServer(RouterConfig(port=0, block_size=16, upstream=UpstreamConfig(poll_interval_s=0.2,
                                                                                      stream_idle_timeout_s=3.0)),
                          specs, tokenizer=tokenizer).start()
    try:
        wait_for(lambda: len(router.runtime.router.healthy) == 2, what="both replicas healthy")
        body = {"prompt": STORY, "max_tokens": 48, "temperature": 0, "ignore_eos": True}
        expected = reference(replicas, "/v1/completions", body)
        fuse.after_events = fuse.events + 12  # hangs after ~a quarter of the stream, its connection open
        events = stream(router.url, "/v1/completions", body)
        assert fuse.blown_by is not None, "no proxy stalled: the test did not test anything"
        check_one_stream(events, chat=False)
        assert text_of(events, chat=False) == text_of(expected, chat=False)
        assert migrations(router) == 1
    finally:
        router.stop()
        for p in proxies:
            p.close()


def test_without_migration_the_cut_stream_ends_with_an_error_event(replicas, tokenizer):
    fuse = Fuse(after_events=10**9)
    proxies = [DyingProxy(f"p{i}", int(rt.http.url.rsplit(":", 1)[1]), fuse) for i, rt in enumerate(replicas)]
    specs = [ReplicaSpec(p.url, replica_id=p.name) for p in proxies]
    router = RouterServer(RouterConfig(port=0, block_size=16, upstream=UpstreamConfig(poll_interval_s=0.2,
                                                                                      migration_limit=0)), specs,
                          tokenizer=tokenizer).start()
    try:
        wait_for(lambda: len(router.runtime.router.healthy) == 2, what="both replicas healthy")
        fuse.after_events = 8
        events = stream(router.url, "/v1/completions", {"prompt": STORY, "max_tokens": 48, "temperature": 0,
                                                         "ignore_eos": True})
        assert events[-1] == "[DONE]" and "incomplete" in events[-2]["error"]["message"]
    finally:
        router.stop()
        for p in proxies:
            p.close()


def test_a_router_without_tokenizer_learns_the_prompt_ids_from_the_replica(replicas):
    """Load-only routing (no tokenizer in the router): the prompt's ids come with the first chunk and the
    new replica's text is passed on (exact here: no stop strings, so the first replica held nothing back)."""
    fuse = Fuse(after_events=10**9)
    proxies = [DyingProxy(f"p{i}", int(rt.http.url.rsplit(":", 1)[1]), fuse) for i, rt in enumerate(replicas)]
    router = RouterServer(RouterConfig(port=0, block_size=16, upstream=UpstreamConfig(poll_interval_s=0.2)),
                          [ReplicaSpec(p.url, replica_id=p.name) for p in proxies]).start()
    try:
        wait_for(lambda: len(router.runtime.router.healthy) == 2, what="both replicas healthy")
        assert router.runtime.tokenizer is None
        body = {"messages": [{"role": "user", "content": STORY}], "max_tokens": 40, "temperature": 0,
                "ignore_eos": True}
        expected = reference(replicas, "/v1/chat/completions", body)
        fuse.after_events = 12
        events = stream(router.url, "/v1/chat/completions", body)
        assert fuse.blown_by is not None
        check_one_stream(events, chat=True)
        assert text_of(events, chat=True) == text_of(expected, chat=True)
        assert migrations(router) == 1
    finally:
        router.stop()
        for p in proxies:
            p.close()
