"""Draining a replica: no new requests reach it, the running ones (streams too) finish,
``GET /replicas`` reports them in flight, and removing it afterwards drops its index."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx

from .conftest import wait_for
from .test_router_http import prompt

TENANT = {"Authorization": "Bearer tenant-key"}
ADMIN = {"Authorization": "Bearer admin-key"}


def _rows(router) -> dict[str, dict]:
    r = httpx.get(router.url + "/replicas?drain_cost=true", headers=ADMIN, timeout=10)
    assert r.status_code == 200, r.text
    return {row["id"]: row for row in r.json()["replicas"]}


def _stream(router, ids) -> tuple[int, str]:
    """A streamed completion; (status, the text of its chunks) and it must end with [DONE]."""
    body = {"prompt": ids, "max_tokens": 2, "stream": True}
    with httpx.stream("POST", router.url + "/v1/completions", json=body, headers=TENANT, timeout=30) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines and lines[-1] == "data: [DONE]", lines
    text = "".join(json.loads(line[6:])["choices"][0]["text"] for line in lines[:-1])
    return r.status_code, text


def _probes(router, replica_id: str, count: int) -> None:
    """Until the router's poller has probed the replica ``count`` more times (its /load answered:
    probes run one round after another, so all but the last of them have finished)."""
    loads = router.runtime.router.loads.loads
    for i in range(count):
        since = loads[replica_id].reported_at
        wait_for(lambda since=since: loads[replica_id].reported_at > since,
                 what=f"probe {i + 1} of {count} of {replica_id}")


def test_drain_lets_streams_finish_and_routes_new_requests_elsewhere(fakes, start_router):
    a, b = fakes
    router = start_router([a.spec, b.spec], api_key="tenant-key", admin_key="admin-key")
    wait_for(lambda: len(router.runtime.router.healthy) == 2, what="both replicas healthy")
    for seed in range(6):  # give both replicas cached blocks
        assert httpx.post(router.url + "/v1/completions", json={"prompt": prompt(seed), "max_tokens": 2},
                          headers=TENANT, timeout=20).status_code == 200
    wait_for(lambda: router.runtime.router.index.num_blocks("a") > 0, what="a's events")
    a.configure(delay=3.0)  # in flight long enough for the drain to find it so, however loaded
    b.configure(delay=3.0)
    with ThreadPoolExecutor(8) as pool:
        running = [pool.submit(_stream, router, prompt(100 + i)) for i in range(8)]
        wait_for(lambda: _rows(router)["a"]["in_flight"] > 0, what="a request in flight on a")
        r = httpx.post(router.url + "/replicas/a/drain", headers=ADMIN, timeout=10)
        assert r.status_code == 200 and r.json()["draining"] and r.json()["in_flight"] > 0, r.text
        a.configure(delay=0)
        b.configure(delay=0)
        later = [pool.submit(_stream, router, prompt(200 + i)) for i in range(8)]
        results = [f.result() for f in running + later]
    assert all(status == 200 for status, _ in results)
    assert [text for _, text in results[8:]] == ["b!"] * 8  # nothing new went to the draining replica
    assert "a!" in [text for _, text in results[:8]]         # ... and what it was running finished there
    wait_for(lambda: _rows(router)["a"]["in_flight"] == 0, what="a's finished streams counted out")
    _probes(router, "a", 3)  # a few health probes: a draining replica stays out of rotation although it answers
    rows = _rows(router)
    assert rows["a"]["draining"] and not rows["a"]["healthy"] and rows["a"]["in_flight"] == 0
    assert rows["b"]["healthy"] and not rows["b"]["draining"]
    assert httpx.delete(router.url + "/replicas/a", headers=ADMIN, timeout=10).status_code == 200
    index = router.runtime.router.index
    assert "a" not in index.replica_ids and index.num_blocks("a") == 0
    assert set(_rows(router)) == {"b"}
    plain = httpx.get(router.url + "/replicas", headers=ADMIN, timeout=10).json()["replicas"]
    assert "exclusive_blocks" not in plain[0]  # the index walk happens only when asked for


def test_exclusive_blocks_counts_what_only_that_replica_holds(fakes, start_router):
    a, b = fakes
    router = start_router([a.spec, b.spec], api_key="tenant-key", admin_key="admin-key")
    wait_for(lambda: len(router.runtime.router.healthy) == 2, what="both replicas healthy")
    # the fakes are the session's: emptied, so that b storing this prompt evicts no older block a also holds (which
    # would make it a's alone again, by however many earlier tests left there)
    index = router.runtime.router.index
    for fake in fakes:
        httpx.post(fake.info["url"] + "/reset_prefix_cache", timeout=10).raise_for_status()
    wait_for(lambda: not index.cached_hashes("a") and not index.cached_hashes("b"), what="both caches emptied")
    r = httpx.post(router.url + "/replicas/b/drain", headers=ADMIN, timeout=10)
    assert r.status_code == 200
    ids = prompt(16_016, n=40)  # 10 blocks of 4, all on a (b is draining)
    assert httpx.post(router.url + "/v1/completions", json={"prompt": ids, "max_tokens": 2},
                      headers=TENANT, timeout=20).json()["choices"][0]["text"] == "a"
    wait_for(lambda: len(index.cached_hashes("a")) >= 10, what="a's blocks in the index")
    before = _rows(router)["a"]["exclusive_blocks"]
    assert before >= 10
    # the same prompt on b too: those blocks are no longer a's alone
    httpx.post(router.url + "/replicas/a/drain", headers=ADMIN, timeout=10)
    router.runtime.replicas.get("b").state = "ready"  # b back in rotation
    router.runtime.router.set_healthy(router.runtime.router.replicas.get("b"), True)
    assert httpx.post(router.url + "/v1/completions", json={"prompt": ids, "max_tokens": 2},
                      headers=TENANT, timeout=20).json()["choices"][0]["text"] == "b"
    wait_for(lambda: _rows(router)["a"]["exclusive_blocks"] <= before - 10, what="b's copy of the blocks")


def test_drain_needs_the_admin_key_and_a_known_replica(fakes, start_router):
    router = start_router([fakes[0].spec], api_key="tenant-key", admin_key="admin-key")
    assert httpx.post(router.url + "/replicas/a/drain", headers=TENANT, timeout=10).status_code == 403
    r = httpx.post(router.url + "/replicas/nope/drain", headers=ADMIN, timeout=10)
    assert r.status_code == 404 and "GET /replicas" in r.json()["error"]["message"]
    assert "a" not in router.runtime.draining


def test_fleet_endpoints_say_when_the_router_runs_no_replicas(start_router):
    router = start_router([], api_key="tenant-key", admin_key="admin-key")
    assert httpx.post(router.url + "/admin/scale", json={"replicas": 2}, headers=TENANT).status_code == 403
    r = httpx.post(router.url + "/admin/scale", json={"replicas": 2}, headers=ADMIN, timeout=10)
    assert r.status_code == 501 and "kvmesh serve" in r.json()["error"]["message"]
    r = httpx.post(router.url + "/admin/scale", json={"replicas": "two"}, headers=ADMIN, timeout=10)
    assert r.status_code == 400
