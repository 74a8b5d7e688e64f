"""The P/D split and peer pulls end to end: a real router in front of fake replicas (one process each, real HTTP,
real KV events) that play the replica side of the contract (cluster/measure/benchmarks/support/fake_kv_transfer.py):
a prefill replica answers with a leased handle, a decode replica records the ``kv_transfer_params`` it got, leases
from ``remote_url`` itself for a peer pull, releases, and reports the tokens it pulled in
``x-kvmesh-kv-pulled-tokens``. Block size 4, prompts of 64 tokens: 15 full blocks (60 tokens) can move."""

from __future__ import annotations

import contextlib
import json
import threading

import httpx
import pytest
from kvmesh.router.routing.kv_placement import KVPlacementRules
from kvmesh.router.routing.receipts import (
    HEADER_KV_NOT_SHARED,
    HEADER_PREFILL,
    HEADER_PULLED_FROM,
    HEADER_PULLED_TOKENS,
)

from .conftest import FakeProc, fake_stats, launched_fakes, replica_rows, wait_for
from .helpers import LAYOUT
from .test_router_http import prompt

MOVABLE = 60
"""Tokens of a 64-token prompt in full blocks a replica may reuse (all but the last token)."""
TRANSFER = {"enabled": True, "pull_bytes_per_s": 1e9, "bytes_per_token": 64, "layout": LAYOUT}


@pytest.fixture(scope="module")
def _trio():
    with launched_fakes("p", "d", "e") as procs:
        yield procs


@pytest.fixture
def trio(_trio):
    """Fake replicas "p" (registered as role=prefill), "d" and "e"; KV transfer on, a prefill rate reported."""
    for p in _trio:
        if p.proc.poll() is not None:
            p.launch().wait_ready()
        p.configure(delay=0, status=200, progress=False, reset_stats=True, prefill_tokens_per_s=1000.0,
                    kv_transfer=TRANSFER)
    yield _trio


@pytest.fixture
def start_router(start_router):
    """The shared one, splitting from 32 uncached tokens, returning once every replica is healthy."""

    def start(specs, **kw):
        server = start_router(specs, **{"transfers": KVPlacementRules(pd_min_uncached_tokens=32), **kw})
        wait_for(lambda: set(server.runtime.router.healthy) == {s.replica_id for s in specs}, what="replicas healthy")
        return server

    return start


def role(fake: FakeProc, name: str):
    spec = fake.spec
    spec.role = name
    return spec


def post(router, ids, stream=False, **kw) -> httpx.Response:
    body = {"prompt": ids, "max_tokens": 2, "stream": stream, **kw}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return httpx.post(router.url + "/v1/completions", json=body, headers={"x-kvmesh-receipt": "1"}, timeout=30)


def answer(r: httpx.Response) -> tuple[str, int]:
    """(who answered, cached tokens) of a streamed or whole completion."""
    assert r.status_code == 200, r.text
    if r.headers["content-type"].startswith("text/event-stream"):
        events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
        text = "".join(c["text"] for e in events for c in e["choices"])
        return text.rstrip("!"), events[-1]["usage"]["prompt_tokens_details"]["cached_tokens"]
    body = r.json()
    return body["choices"][0]["text"], body["usage"]["prompt_tokens_details"]["cached_tokens"]


def sample(router, name: str, **labels) -> float:
    return router.runtime.metrics.registry.get_sample_value(f"kvmesh_router_{name}_total", labels) or 0


def received(fake: FakeProc) -> list[dict]:
    return fake_stats(fake)["kv_transfer_params"]


@pytest.mark.parametrize("stream", [False, True])
def test_long_uncached_prompt_is_prefilled_on_the_prefill_replica_and_decoded_with_its_handle(trio, start_router,
                                                                                             stream):
    p, d, _ = trio
    router = start_router([role(p, "prefill"), role(d, "decode")])
    r = post(router, prompt(7000 + stream), stream=stream)
    assert answer(r) == ("d", MOVABLE)  # decoded on d, the prompt's blocks pulled from p
    assert received(p) == [{"do_remote_decode": True}]
    [handle] = received(d)
    assert handle["do_remote_prefill"] is True and handle["remote_url"] == p.info["url"]
    assert handle["remote_engine_id"] == "p" and handle["num_tokens"] == MOVABLE
    assert "remote_block_ids" not in handle  # d reads only what p's /kv/lease answers for the prompt
    assert handle["remote_lease_id"] and fake_stats(p)["leases_active"] == 0  # d showed the lease, released it
    assert r.headers[HEADER_PREFILL] == "p" and r.headers[HEADER_PULLED_TOKENS] == str(MOVABLE)
    assert HEADER_PULLED_FROM not in r.headers
    assert sample(router, "pd_splits", outcome="ok") == 1 and sample(router, "kv_pulled_tokens") == MOVABLE


def test_chat_is_split_too_the_prefill_call_carries_the_routers_token_ids(trio, start_router, tokenizer):
    p, d, _ = trio
    router = start_router([role(p, "prefill"), role(d, "decode")])
    messages = [{"role": "user", "content": "Once upon a time there was a little dog who liked to run. " * 4}]
    r = httpx.post(router.url + "/v1/chat/completions", json={"messages": messages, "max_tokens": 2}, timeout=30)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "d", r.text
    assert received(p) == [{"do_remote_decode": True}]
    assert received(d)[0]["remote_url"] == p.info["url"]
    assert sample(router, "pd_splits", outcome="ok") == 1


def test_a_prefill_replica_of_another_kv_layout_gets_no_split_and_the_receipt_says_why(trio, start_router):
    p, d, _ = trio
    p.configure(kv_transfer=dict(TRANSFER, layout=dict(LAYOUT, dtype="float8_e4m3fn")))  # mid-rollout to FP8
    router = start_router([role(p, "prefill"), role(d, "decode")])
    r = post(router, prompt(7050))
    assert answer(r) == ("d", 0) and received(p) == [] and received(d) == []  # computed whole on d
    assert HEADER_PREFILL not in r.headers
    assert r.headers[HEADER_KV_NOT_SHARED] == "the KV layout of p differs from d's: dtype float8_e4m3fn on p vs " \
                                              "bfloat16 on d"
    assert sample(router, "pd_splits", outcome="skipped_layout") == 1


def test_short_prompt_or_one_mostly_cached_on_the_decode_replica_is_not_split(trio, start_router):
    p, d, _ = trio
    router = start_router([role(p, "prefill"), role(d, "decode")])
    assert answer(post(router, prompt(7100, n=24))) == ("d", 0)  # 24 < 32 uncached tokens
    ids = prompt(7101)
    assert answer(post(router, ids))[0] == "d"  # split: d now holds the prompt
    wait_for(lambda: router.runtime.router.index.num_blocks("d") >= 15, what="d's blocks in the index")
    r = post(router, ids)
    assert answer(r) == ("d", MOVABLE)  # 4 uncached tokens: served whole, from d's own cache
    assert len(received(p)) == 1 and len(received(d)) == 1
    assert HEADER_PREFILL not in r.headers


@pytest.mark.parametrize("fault", ["dead", "http_500", "timeout"])
def test_a_failed_prefill_costs_one_deadline_and_the_decode_replica_computes_the_prompt(trio, start_router, fault):
    p, d, _ = trio
    router = start_router([role(p, "prefill"), role(d, "decode")],
                          upstream={"poll_interval_s": 60.0, "first_byte_timeout_s": 1.0})
    if fault == "dead":
        p.kill()
    else:
        p.configure(**({"status": 500} if fault == "http_500" else {"delay": 3600}))
    for stream in (False, True):
        r = post(router, prompt(7200 + 10 * len(fault) + stream), stream=stream)  # a prompt d never saw
        assert answer(r) == ("d", 0)
        assert HEADER_PREFILL not in r.headers
    assert received(d) == []  # the requests went as sent
    kind = {"dead": "connect", "http_500": "http_5xx", "timeout": "first_byte_deadline"}[fault]
    assert sample(router, "replica_failures", replica="p", kind=kind) >= 1
    assert sample(router, "pd_splits", outcome="prefill_failed") >= 1


def busy(fake: FakeProc) -> None:
    """One completion sent to ``fake`` directly (the module's fakes may be gone before it ends)."""
    with contextlib.suppress(httpx.HTTPError):
        httpx.post(fake.info["url"] + "/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 1}, timeout=30)


def test_no_prefill_replica_with_room_no_split(trio, start_router):
    p, d, _ = trio
    router = start_router([role(p, "prefill"), role(d, "decode")], transfers=KVPlacementRules(32, 1000))
    p.configure(delay=5.0, progress=True)  # a long prefill on p: its /load shows ~5000 queued tokens
    threading.Thread(target=busy, args=(p,), daemon=True).start()
    wait_for(lambda: router.runtime.router.loads.loads["p"].queued_prefill_tokens > 1000, what="p's backlog seen")
    assert answer(post(router, prompt(7300))) == ("d", 0)
    assert received(p) == [] and received(d) == []
    assert sample(router, "pd_splits", outcome="skipped_no_room") == 1


def test_prefill_replicas_never_get_a_request_to_decode(trio, start_router):
    p, d, _ = trio
    router = start_router([role(p, "prefill"), role(d, "both")], policy="round_robin")
    for seed in range(8):
        assert answer(post(router, prompt(7400 + seed, n=16)))[0] == "d"
    assert fake_stats(p)["auth_seen"] == []  # not one completion reached p
    rows = {r["id"]: r for r in replica_rows(router)}
    assert rows["p"]["role"] == "prefill" and rows["d"]["role"] == "both"
    router.runtime.drain(router.runtime.replicas.get("d"))
    r = post(router, prompt(7410, n=16))
    assert r.status_code == 503 and "role prefill" in r.json()["error"]["message"]


def test_clients_may_not_send_kv_transfer_params(trio, start_router):
    p, d, _ = trio
    router = start_router([role(p, "prefill"), role(d, "decode")])
    r = post(router, prompt(7500), kv_transfer_params={"do_remote_prefill": True, "remote_url": "http://evil:1"})
    assert r.status_code == 400 and "kv_transfer_params may not be sent to the router" in r.json()["error"]["message"]
    assert received(d) == [] and received(p) == []


# ---------------------------------------------------------------- peer pulls
def registered(router) -> bool:
    """Every replica of ``router`` got its replica set (``POST /kv/peers`` answered 200): it pulls from its peers."""
    return all(not r.kv_peers_pending for r in router.runtime.router.replicas)


def holder_then_other(router, ids) -> tuple[str, httpx.Response]:
    """Send ``ids`` once (its replica becomes the holder), wait for its blocks in the index, then again (round
    robin: the other replica): (the holder, the second answer)."""
    wait_for(lambda: registered(router), what="the replica set registered on every replica")
    stats = router.runtime.router.index.stats
    before = stats.blocks_stored  # a full cache evicts as it stores: count the stored events, not the blocks held
    holder = answer(post(router, ids))[0]
    wait_for(lambda: stats.blocks_stored >= before + 15, what="the holder's blocks in the index")
    return holder, post(router, ids)


def test_a_request_sent_away_from_the_holder_pulls_the_prefix_from_it(trio, start_router):
    _, d, e = trio
    router = start_router([d.spec, e.spec], policy="round_robin")
    wait_for(lambda: all(load.kv_transfer_enabled for load in router.runtime.router.loads.loads.values()),
             what="kv_transfer seen in /load")
    holder, r = holder_then_other(router, prompt(7600))
    other = {"d": e, "e": d}[holder]
    assert answer(r) == (other.name, MOVABLE)  # computed nothing it could pull
    [params] = received(other)
    assert params == {"do_remote_prefill": True, "remote_url": {"d": d, "e": e}[holder].info["url"]}
    assert r.headers[HEADER_PULLED_FROM] == holder and r.headers[HEADER_PULLED_TOKENS] == str(MOVABLE)
    assert fake_stats({"d": d, "e": e}[holder])["leases_released"] == 1
    assert sample(router, "peer_pulls") == 1 and sample(router, "kv_pulled_tokens") == MOVABLE
    r = post(router, prompt(7600))  # back on the holder: nothing to pull
    assert answer(r)[0] == holder and HEADER_PULLED_FROM not in r.headers


def test_no_pull_is_planned_to_a_replica_whose_peer_registration_failed_until_a_retry_lands(trio, start_router):
    _, d, e = trio
    for fake in (d, e):
        fake.configure(kv_transfer=dict(TRANSFER, refuse_peers=1000))  # every POST /kv/peers answers 503
    router = start_router([d.spec, e.spec], policy="round_robin", upstream={"kv_peers_renew_s": 600.0})
    wait_for(lambda: all(r.load.kv_transfer_enabled and r.kv_peers_pending for r in router.runtime.router.replicas),
             what="both replicas seen with transfer on and no registration landed")
    holder = answer(post(router, prompt(7650)))[0]
    wait_for(lambda: router.runtime.router.index.num_blocks(holder) >= 15, what="the holder's blocks in the index")
    r = post(router, prompt(7650))
    other = {"d": e, "e": d}[holder]
    assert answer(r) == (other.name, 0) and HEADER_PULLED_FROM not in r.headers
    assert received(other) == [] and sample(router, "peer_pulls") == 0  # it would have skipped a pull: none sent
    for fake in (d, e):
        fake.configure(kv_transfer=TRANSFER)  # registrations land again
    wait_for(lambda: registered(router) and fake_stats(other)["kv_peers"], timeout=20.0,
             what="the failed registrations retried well before the next renewal (600 s)")
    holder, r = holder_then_other(router, prompt(7660))
    assert answer(r) == ({"d": e, "e": d}[holder].name, MOVABLE) and r.headers[HEADER_PULLED_FROM] == holder


@pytest.mark.parametrize("why", ["transfer_off", "slower_than_recompute"])
def test_no_pull_when_one_end_has_transfer_off_or_pulling_costs_more(trio, start_router, why):
    _, d, e = trio
    slow = dict(TRANSFER, pull_bytes_per_s=100.0)  # 15 blocks of 256 B at 100 B/s: 38 s against 60 ms
    off = why == "transfer_off"
    d.configure(kv_transfer=TRANSFER if off else slow)  # off: d would pull, but e has transfer off
    e.configure(kv_transfer={"enabled": False} if off else slow)
    router = start_router([d.spec, e.spec], policy="round_robin")
    wait_for(lambda: router.runtime.router.loads.loads["d"].pull_bytes_per_s is not None, what="d's /load seen")
    holder, r = holder_then_other(router, prompt(7700 + off))
    assert answer(r) == ({"d": "e", "e": "d"}[holder], 0)
    assert received(d) == [] and received(e) == []
    assert sample(router, "peer_pulls") == 0


# ---------------------------------------------------------------- roles over the admin API and the command line
ADMIN = {"Authorization": "Bearer admin-key"}


def test_admin_api_registers_a_prefill_replica_and_refuses_a_bad_role(trio, start_router):
    p, d, _ = trio
    router = start_router([role(d, "decode")], admin_key="admin-key")
    bad = httpx.post(router.url + "/replicas", json={"url": p.info["url"], "id": "p", "role": "prefil"}, headers=ADMIN)
    assert bad.status_code == 400
    assert "role='prefil' is not a replica role; choose one of prefill, decode, both" in bad.json()["error"]["message"]
    ok = httpx.post(router.url + "/replicas", json={"url": p.info["url"], "events": p.info["events"], "id": "p",
                                                    "role": "prefill"}, headers=ADMIN)
    assert ok.status_code == 200 and ok.json() == {"id": "p", "healthy": True}
    rows = {r["id"]: r["role"] for r in replica_rows(router)}
    assert rows == {"p": "prefill", "d": "decode"}
    assert answer(post(router, prompt(7800))) == ("d", MOVABLE)  # split through the registered prefill replica
    assert received(p) == [{"do_remote_decode": True}]


def test_standalone_router_refuses_a_bad_role_with_a_clear_error(capsys):
    from kvmesh.cluster.cli import main

    assert main(["router", "--replica", "http://127.0.0.1:9,role=decoder"]) == 2
    err = capsys.readouterr().err
    assert "role='decoder' is not a replica role; choose one of prefill, decode, both" in err and "Traceback" not in err


def test_access_log_names_the_prefill_replica_and_the_tokens_moved(trio, start_router, caplog):
    p, d, _ = trio
    router = start_router([role(p, "prefill"), role(d, "decode")], access_log=True)
    with caplog.at_level("INFO", logger="kvmesh.router.access"):
        answer(post(router, prompt(7900)))
        wait_for(lambda: any(r.name == "kvmesh.router.access" for r in caplog.records), what="the access log line")
    line = json.loads(next(r.getMessage() for r in caplog.records if r.name == "kvmesh.router.access"))
    assert line["replica"] == "d" and line["prefill_replica"] == "p" and line["kv_pulled_tokens"] == MOVABLE
    assert line["cached_tokens"] == MOVABLE and line["kv_pulled_from"] is None
    summary = router.runtime.router.receipts.summary()["cluster"]
    assert summary["mispredicted"] == 0  # the pulled tokens are not held against the index's prediction


@pytest.mark.parametrize(("keys", "sent"), [
    ({"upstream": {"replica_api_key": "replica-key-1234"}}, "replica-key-1234"),
    ({"upstream": {"replica_api_key": "replica-key-1234"}, "internal_key": "cluster-internal-key"},
     "cluster-internal-key"),
])
def test_the_prefill_call_carries_the_replicas_key(trio, start_router, keys, sent):
    p, d, _ = trio
    router = start_router([role(p, "prefill"), role(d, "decode")], **keys)
    assert answer(post(router, prompt(8000 + 100 * len(keys))))[0] == "d"  # a prompt d does not hold yet
    assert fake_stats(p)["auth_seen"] == [f"Bearer {sent}"]  # the prefill call, nothing else
    assert fake_stats(d)["auth_seen"] == [f"Bearer {sent}"]


# ---------------------------------------------------------------- the replicas' pull peers
def test_the_router_registers_its_replica_set_on_every_replica_and_again_after_a_restart(trio, start_router):
    from kvmesh.replica.server.kv_peers import normalize_url

    p, d, e = trio
    router = start_router([role(p, "prefill"), d.spec, e.spec])
    every = sorted(normalize_url(f.info["url"]) for f in trio)
    for fake in trio:
        wait_for(lambda fake=fake: sorted(fake_stats(fake)["kv_peers"]) == every, what=f"{fake.name}'s peers")
    router.runtime.remove_replica("e")
    wait_for(lambda: sorted(fake_stats(d)["kv_peers"]) == sorted(normalize_url(f.info["url"]) for f in (p, d)),
             what="e gone from d's peers")
    d.kill()  # a restart: the new process knows no peers
    d.launch().wait_ready()
    d.configure(kv_transfer=TRANSFER, prefill_tokens_per_s=1000.0)
    wait_for(lambda: len(fake_stats(d)["kv_peers"]) == 2, what="the restarted d's peers registered again")
    assert answer(post(router, prompt(8100))) == ("d", MOVABLE)  # and it pulls from p again
    d.configure(reset_stats=True)  # a restart between two polls: healthy throughout, its /load says 0 peers
    wait_for(lambda: len(fake_stats(d)["kv_peers"]) == 2, what="d's peers registered after its /load said none")


def test_a_replica_told_no_peers_computes_instead_of_calling_remote_url(trio, start_router):
    p, d, _ = trio
    router = start_router([role(p, "prefill"), role(d, "decode")])
    wait_for(lambda: len(fake_stats(d)["kv_peers"]) == 2, what="d's peers")
    # d knows only itself, not p. Not an empty set: a /load saying 0 peers makes the router register them again
    # (as after a restart), which could land before the request below.
    only_d = {"router_id": router.runtime.kv_peers.router_id, "peers": [{"replica_id": "d", "url": d.info["url"]}]}
    httpx.post(d.info["url"] + "/kv/peers", json=only_d, timeout=5).raise_for_status()
    r = post(router, prompt(8200))
    assert answer(r) == ("d", 0)  # p prefilled and leased, d did not call it: computed
    assert r.headers[HEADER_PULLED_TOKENS] == "0"
