"""P/D and peer pulls, live: `kvmesh serve` with 1 prefill + 1 decode replica of stories260K on the session's Ray, then
a
cluster of 2 replicas that pull a prefix from each other. Module order: roles in status and in the router, a
long unseen prompt prefilled on one replica and decoded on the other (same greedy text as one replica), scale,
drain rules per role, the prefill replica killed under a bounded load (no request fails); then the peer pull.

Needs the replica side (the /kv routes, kv_transfer_params, the kvmesh:kv_transfer_* counters) and the router
side (roles, the split, peer-pull pricing), and nixl (the replicas' transport)."""

from __future__ import annotations

import json
import threading
import time
import uuid

import httpx
import pytest

from .live_cluster import admin_headers, fleet_idle, start_cluster, wait_fleet

pytestmark = [pytest.mark.ray, pytest.mark.slow]

PROMPT_TOKENS = 428
"""The acceptance prompt: 26 full blocks of 16 and 12 tokens more."""
STORY = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her "
         "friends. One day, she saw a big red ball under a tree. She ran to the ball and picked it up. Her mom "
         "said, you can keep the ball if you share it. Lily was happy and said thank you. Then a small dog came "
         "and wanted to play too. Lily threw the ball and the dog ran after it, and they played until the sun "
         "went down. ")


@pytest.fixture(scope="module")
def nixl():
    from kvmesh.replica.kv_transfer.nixl_agent import nixl_missing

    if (why := nixl_missing()) is not None:
        pytest.skip(why)


@pytest.fixture(scope="module")
def tokenizer(stories_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(stories_path))


def unseen_prompt(tokenizer, tokens: int, prefix: str = "") -> list[int]:
    """``tokens`` token ids of a story no replica has seen (a fresh id leads it), BOS first."""
    text = prefix + f"Story {uuid.uuid4().hex}. " + STORY * (1 + tokens // 60)
    ids = tokenizer(text)["input_ids"]
    assert len(ids) >= tokens
    return ids[:tokens]


@pytest.fixture(scope="module")
def reference(stories_path):
    """Greedy text of one engine, no cluster: what every answer below must equal."""
    from kvmesh.replica.llm import LLM
    from kvmesh.replica.serving.sampling_params import SamplingParams

    llm = LLM(str(stories_path), kv_cache_memory=16 << 20, max_num_batched_tokens=512)

    def generate(prompt: list[int], max_tokens: int) -> str:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        return llm.generate([prompt], params)[0].text

    return generate


@pytest.fixture(scope="module")
def pd(ray_session, stories_path, tmp_path_factory, nixl):
    serve = start_cluster(stories_path, tmp_path_factory, "pd", replicas={"num_replicas": 1, "num_prefill_replicas": 1})
    yield serve
    serve.stop()


def _complete(cluster, prompt: list[int], max_tokens: int = 16, **headers: str) -> httpx.Response:
    body = {"model": cluster.state.served_model_name, "prompt": prompt, "max_tokens": max_tokens,
            "temperature": 0.0, "ignore_eos": True}
    response = httpx.post(cluster.url + "/v1/completions", json=body, headers=headers, timeout=120)
    assert response.status_code == 200, response.text
    return response


def _status(cluster, monkeypatch, capsys) -> dict[str, dict]:
    """``kvmesh status --json``'s replica rows by id."""
    from kvmesh.cluster.cli import main

    monkeypatch.setenv("KVMESH_CLUSTERS_DIR", str(cluster.admin_key_file.parent))
    monkeypatch.delenv("KVMESH_ADMIN_KEY", raising=False)
    capsys.readouterr()
    assert main(["status", "--url", cluster.url, "--json"]) == 0
    return {r["replica_id"]: r for r in json.loads(capsys.readouterr().out)["replicas"]}


def test_status_and_the_router_show_each_replicas_role(pd, monkeypatch, capsys):
    rows = httpx.get(pd.url + "/replicas", headers=admin_headers(pd), timeout=10).json()["replicas"]
    assert {r["id"]: r["role"] for r in rows} == {"replica-0": "decode", "prefill-1": "prefill"}
    status = _status(pd, monkeypatch, capsys)
    assert {rid: r["role"] for rid, r in status.items()} == {"replica-0": "decode", "prefill-1": "prefill"}
    from kvmesh.cluster.cli import main

    assert main(["status", "--url", pd.url]) == 0
    table = capsys.readouterr().out
    assert "ROLE" in table and "PULLS" in table and "MOVED" in table, table
    assert "fleet: 2 replicas (1 prefill), target 1 + 1 prefill" in table, table


def test_a_long_unseen_prompt_is_prefilled_on_one_replica_and_decoded_on_the_other(
        pd, tokenizer, reference, monkeypatch, capsys):
    prompt = unseen_prompt(tokenizer, PROMPT_TOKENS)
    before = _status(pd, monkeypatch, capsys)
    response = _complete(pd, prompt, **{"x-kvmesh-receipt": "1"})
    answer = response.json()
    assert answer["usage"]["prompt_tokens"] == PROMPT_TOKENS
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] >= 384, answer["usage"]
    assert answer["choices"][0]["text"] == reference(prompt, 16)
    receipt = {k: v for k, v in response.headers.items() if k.startswith("x-kvmesh-")}
    assert receipt.get("x-kvmesh-replica") == "replica-0", receipt  # decoded there
    assert receipt.get("x-kvmesh-prefill-replica") == "prefill-1", receipt  # prefilled there
    assert int(receipt.get("x-kvmesh-kv-pulled-tokens", 0)) >= 384, receipt  # and handed over
    after = _status(pd, monkeypatch, capsys)
    decode, prefill = after["replica-0"], after["prefill-1"]
    assert decode["kv_pulls"] == (before["replica-0"]["kv_pulls"] or 0) + 1, decode
    assert decode["kv_pulled_tokens"] - before["replica-0"]["kv_pulled_tokens"] >= 384
    assert decode["kv_pulled_bytes"] > before["replica-0"]["kv_pulled_bytes"]
    assert prefill["kv_leases"] > before["prefill-1"]["kv_leases"], prefill  # it handed the KV over
    with capsys.disabled():
        print(f"\nP/D: {PROMPT_TOKENS}-token prompt prefilled on prefill-1, decoded on replica-0: cached_tokens "
              f"{answer['usage']['prompt_tokens_details']['cached_tokens']}, "
              f"{decode['kv_pulled_bytes'] - before['replica-0']['kv_pulled_bytes']} bytes pulled")


def test_the_replicas_kv_plane_is_closed_to_all_but_the_cluster(pd):
    """serve's replicas take the internal key the router sends and nothing else: without it, no /kv/*, no
    kv_transfer_params, no request at all."""
    assert httpx.get(pd.url + "/replicas", timeout=10).status_code == 403  # the replicas' URLs: admin only
    rows = httpx.get(pd.url + "/replicas", headers=admin_headers(pd), timeout=10).json()["replicas"]
    urls = {r["id"]: r["url"] for r in rows}
    r = httpx.get(urls["prefill-1"] + "/kv/handshake", timeout=10)
    assert r.status_code == 401, r.text
    r = httpx.post(urls["replica-0"] + "/v1/completions", timeout=30, json={
        "prompt": [5, 6, 7], "max_tokens": 1, "kv_transfer_params": {"do_remote_prefill": True,
                                                                      "remote_url": urls["prefill-1"]}})
    assert r.status_code == 401 and "takes requests only from its router" in r.json()["error"]["message"], r.text
    r = httpx.post(urls["replica-0"] + "/v1/completions", json={"prompt": [5, 6, 7], "max_tokens": 1}, timeout=30)
    assert r.status_code == 401, r.text  # nor may a tenant skip the router's admission by calling a replica


def test_scale_the_prefill_role_by_the_cli(pd, monkeypatch, capsys):
    from kvmesh.cluster.cli import main

    monkeypatch.setenv("KVMESH_CLUSTERS_DIR", str(pd.admin_key_file.parent))
    monkeypatch.delenv("KVMESH_ADMIN_KEY", raising=False)
    assert main(["scale", "--role", "prefill", "2", "--url", pd.url, "--wait", "240"]) == 0
    state = wait_fleet(pd, lambda s: fleet_idle(s) and len(s["replicas"]) == 3, 10, "3 replicas")
    new = [rid for rid, role in state["roles"].items() if role == "prefill" and rid != "prefill-1"]
    assert new == ["prefill-2"] and state["prefill_target"] == 2, state  # a fresh index, the prefill name
    rows = httpx.get(pd.url + "/replicas", headers=admin_headers(pd), timeout=10).json()["replicas"]
    assert {r["id"]: r["role"] for r in rows}["prefill-2"] == "prefill"


def test_the_last_decode_replica_is_not_drained_and_a_prefill_replica_is(pd, monkeypatch, capsys):
    from kvmesh.cluster.cli import main

    monkeypatch.setenv("KVMESH_CLUSTERS_DIR", str(pd.admin_key_file.parent))
    monkeypatch.delenv("KVMESH_ADMIN_KEY", raising=False)
    assert main(["drain", "replica-0", "--url", pd.url]) == 1
    err = capsys.readouterr().err
    assert "409" in err and "last replica that decodes" in err, err
    assert main(["drain", "prefill-2", "--url", pd.url, "--wait", "120"]) == 0
    assert "kvmesh scale --role prefill N" in capsys.readouterr().out
    state = wait_fleet(pd, lambda s: fleet_idle(s) and "prefill-2" not in s["replicas"], 10, "prefill-2 removed")
    assert sorted(state["replicas"]) == ["prefill-1", "replica-0"] and state["prefill_target"] == 1


def test_killing_the_prefill_replica_under_load_fails_no_request(pd, tokenizer, monkeypatch, capsys):
    import ray

    clients, per_client = 16, 3
    results: list[tuple[int, str]] = []
    lock = threading.Lock()
    prompts = [[unseen_prompt(tokenizer, 300) for _ in range(per_client)] for _ in range(clients)]

    def client(mine: list[list[int]]) -> None:
        with httpx.Client(timeout=180) as http:
            for prompt in mine:
                body = {"model": pd.state.served_model_name, "prompt": prompt, "max_tokens": 8, "temperature": 0.0}
                try:
                    r = http.post(pd.url + "/v1/completions", json=body)
                    outcome = (r.status_code, r.text[:200])
                except httpx.HTTPError as e:
                    outcome = (0, f"{type(e).__name__}: {e}")
                with lock:
                    results.append(outcome)

    leases = _status(pd, monkeypatch, capsys)["prefill-1"]["kv_leases"]
    threads = [threading.Thread(target=client, args=(p,), daemon=True) for p in prompts]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120  # kill it once it is handing KV over under this load
    while _status(pd, monkeypatch, capsys)["prefill-1"]["kv_leases"] == leases:
        assert time.monotonic() < deadline, "the prefill replica took no part in the load"
        time.sleep(0.2)
    victim = next(h for h in pd.state.replicas if h.replica_id == "prefill-1")
    ray.kill(victim.actor, no_restart=True)
    for t in threads:
        t.join(timeout=300)
    assert len(results) == clients * per_client
    failed = [r for r in results if r[0] != 200]
    assert not failed, failed[:3]
    deadline = time.monotonic() + 30  # the supervisor sees the death on its next poll (every second)
    while not any("prefill-1 is dead" in m for m in pd.messages):
        assert time.monotonic() < deadline, pd.messages[-10:]
        time.sleep(0.2)
    splits = {s.labels["outcome"]: int(s.value) for s in _samples(httpx.get(pd.url + "/metrics", timeout=10).text,
                                                                     "kvmesh_router_pd_splits_total")}
    with capsys.disabled():
        print(f"\nprefill-1 killed under {clients} clients: {len(results)} requests, 0 failed; router splits "
              f"{splits}")


def _samples(text: str, name: str) -> list:
    from prometheus_client.parser import text_string_to_metric_families

    return [s for family in text_string_to_metric_families(text) for s in family.samples if s.name == name]


@pytest.fixture(scope="module")
def peers(ray_session, stories_path, tmp_path_factory, nixl, pd):
    pd.stop()  # one cluster at a time on this machine
    # stories260K computes a 320-token prefix in milliseconds, less than a pull's default fixed overhead (10 ms,
    # sized for real models): priced as on a real model, the pull pays; and the running requests on the holder
    # outweigh its 320 cached tokens in the seconds cache_aware predicts (router/routing/cost/); the default
    # cache_aware_tokens does not price a pull, and keeps the holder until its queue outweighs the prefill saved
    serve = start_cluster(stories_path, tmp_path_factory, "peers", replicas={"num_replicas": 2, "kv_transfer": "on"},
                          router={"peer_pull_overhead_s": 0.0, "policy": "cache_aware"})
    yield serve
    serve.stop()


def test_a_replica_pulls_a_busy_holders_prefix_instead_of_computing_it(peers, tokenizer, reference):
    shared = unseen_prompt(tokenizer, 320)  # 20 full blocks the holder computes first
    first = _complete(peers, shared + tokenizer(" The end.")["input_ids"][1:], **{"x-kvmesh-receipt": "1"})
    holder = first.headers["x-kvmesh-replica"]
    holder_url = next(h.endpoints["http_url"] for h in peers.state.replicas if h.replica_id == holder)
    stop, busy = threading.Event(), []

    internal = {"Authorization": f"Bearer {peers.router_config().internal_key}"}  # a replica takes only the router's

    def keep_busy() -> None:  # bounded: at most 90 s, straight to the holder, so the router sees its load
        body = {"model": peers.state.served_model_name, "prompt": STORY, "max_tokens": 64, "ignore_eos": True}
        end = time.monotonic() + 90
        with httpx.Client(timeout=120, headers=internal) as http:
            while not stop.is_set() and time.monotonic() < end:
                busy.append(http.post(holder_url + "/v1/completions", json=body).status_code)

    threads = [threading.Thread(target=keep_busy, daemon=True) for _ in range(16)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 60  # the router sees the holder's load in its /load reports
        while {r.replica_id: r for r in peers.state.router_client.status()}[holder].num_running < 4:
            assert time.monotonic() < deadline, "the holder never looked busy to the router"
            time.sleep(0.1)
        prompt = shared + tokenizer(" Then they went home.")["input_ids"][1:]
        response = _complete(peers, prompt, **{"x-kvmesh-receipt": "1"})
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=130)
    answer = response.json()
    assert response.headers["x-kvmesh-replica"] != holder, dict(response.headers)  # sent away from the holder
    assert response.headers.get("x-kvmesh-kv-pulled-from") == holder, dict(response.headers)
    assert int(response.headers.get("x-kvmesh-kv-pulled-tokens", 0)) > 0, dict(response.headers)
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, answer["usage"]  # ... and it pulled
    assert answer["choices"][0]["text"] == reference(prompt, 16)
    assert busy and all(code == 200 for code in busy)
