"""LoRA adapters over HTTP on a real stories260K replica: ``"model": "<adapter>"``, /v1/models, runtime load and
unload (the admin plane), /load's lora section and the adapter's name in the KV events."""

from __future__ import annotations

import json
import random
import shutil
import time

import httpx
import pytest
import zmq
from kvmesh.events.codec import decode_batch
from kvmesh.events.schema import BlockStored
from kvmesh.events.wire import END_SEQ, pack_seq

from .lora_fixtures import greedy, make_adapter
from .test_lora_identity import poisoned

pytest.importorskip("peft")

API, ADMIN, INTERNAL = "tenant-key-0001", "admin-key-00002", "internal-key-003"
STORY = ("Once upon a time, there was a little girl named Lily. She loved to play in the park with her "
         "big red ball. One day, she saw a dog in the park.")
MAX_TOKENS = 8


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def adapters(stories_path, tmp_path_factory):
    """Three PEFT directories: ``tiny`` (served from the start), ``late`` (loaded at runtime) and ``wide`` (rank 16,
    above the replica's --max-lora-rank 8); and the reference models of the first two."""
    root = tmp_path_factory.mktemp("adapters")
    tiny = make_adapter(stories_path, root / "tiny", seed=1)
    late = make_adapter(stories_path, root / "late", seed=2)
    make_adapter(stories_path, root / "wide", seed=3, r=16)
    return root, {"tiny": tiny, "late": late}


@pytest.fixture(scope="module")
def replica(stories_path, adapters):
    from kvmesh.replica.config import EngineConfig
    from kvmesh.replica.runtime import ReplicaRuntime
    from kvmesh.replica.server.config import ReplicaServerConfig

    root, _ = adapters
    engine = EngineConfig(model=str(stories_path), dtype="float32", kv_cache_memory=4 << 20, enable_lora=True,
                          max_loras=2, max_lora_rank=8, lora_modules={"tiny": str(root / "tiny")})
    server = ReplicaServerConfig(host="127.0.0.1", port=0, event_port=0, replay_port=0, api_key=API,
                                 admin_key=ADMIN, internal_key=INTERNAL)
    runtime = ReplicaRuntime.start(engine, server)
    try:
        yield runtime
    finally:
        runtime.shutdown(graceful_s=1)


@pytest.fixture(scope="module")
def client(replica):
    with httpx.Client(base_url=replica.http.url, timeout=60, headers=bearer(API)) as c:
        yield c


def complete(client, model: str, prompt_ids: list[int]) -> dict:
    r = client.post("/v1/completions", json={"model": model, "prompt": prompt_ids, "max_tokens": MAX_TOKENS,
                                             "temperature": 0, "ignore_eos": True, "logprobs": 1})
    assert r.status_code == 200, r.text
    return r.json()


def assert_matches_reference(body: dict, prompt_ids: list[int], reference, tokenizer) -> None:
    tokens, logprobs = reference.tokens, reference.logprobs
    choice = body["choices"][0]
    assert choice["text"] == tokenizer.decode(prompt_ids + tokens)[len(tokenizer.decode(prompt_ids)):]
    assert choice["logprobs"]["token_logprobs"] == pytest.approx(logprobs, abs=1e-4)


def test_the_adapter_gives_transformers_peft_greedy_tokens_and_logprobs(client, replica, adapters, stories_path):
    ids = replica.state.tokenizer.render_completion(STORY)
    tiny = adapters[1]["tiny"]
    body = complete(client, "tiny", ids)
    assert body["model"] == "tiny"
    tokenizer = replica.state.tokenizer
    reference = greedy(tiny, ids, MAX_TOKENS)
    assert_matches_reference(body, ids, reference, tokenizer)
    with tiny.disable_adapter():  # the base model's own answer, from the same weights
        base_reference = greedy(tiny, ids, MAX_TOKENS)
    assert base_reference.tokens != reference.tokens  # the adapter changes the answer
    base = complete(client, replica.state.model_name, ids)
    assert_matches_reference(base, ids, base_reference, tokenizer)
    assert base["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # the adapter's blocks are not the base's


def test_models_lists_the_adapter_with_the_base_as_parent(client, replica, adapters):
    data = {card["id"]: card for card in client.get("/v1/models").json()["data"]}
    base = replica.state.model_name
    assert data[base]["parent"] is None
    assert data["tiny"]["parent"] == base and data["tiny"]["root"] == "tiny"  # a tenant sees no host path
    admin = {card["id"]: card for card in client.get("/v1/models", headers=bearer(ADMIN)).json()["data"]}
    assert admin["tiny"]["root"] == str(adapters[0] / "tiny")


def test_the_adapters_blocks_carry_its_name_in_the_events(client, replica):
    ids = replica.state.tokenizer.render_completion("Tom had a big dog. " * 6)
    complete(client, "tiny", ids)
    stored = [e for batch in replay(replica.endpoints()["replay_endpoint"]) for e in batch.events
              if isinstance(e, BlockStored) and e.token_ids[:16] == ids[:16]]
    assert stored and all(e.lora_name == "tiny" for e in stored)
    identity = client.get("/load").json()["lora"]["identities"]["tiny"]  # the digest of the weights it read
    assert all(keys == ["tiny", identity] for e in stored for keys in e.extra_keys)  # vLLM's per-block extra keys


def test_an_adapter_unloaded_and_loaded_from_other_weights_answers_as_those_weights(client, replica, adapters):
    root, _ = adapters
    ids = [random.Random(44).randrange(3, 500) for _ in range(121)]  # 7 full blocks of 16

    def load(name: str, path) -> None:
        r = client.post("/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(path)},
                        headers=bearer(ADMIN))
        assert r.status_code == 200, r.text

    def unload(name: str) -> None:
        assert client.post("/v1/unload_lora_adapter", json={"lora_name": name},
                           headers=bearer(ADMIN)).status_code == 200

    load("re", root / "tiny")
    old = complete(client, "re", ids)
    unload("re")
    load("re", root / "late")
    again = complete(client, "re", ids)
    load("fresh", root / "late")
    fresh = complete(client, "fresh", ids)
    identities = client.get("/load").json()["lora"]["identities"]
    unload("re")
    unload("fresh")
    assert identities["re"] == identities["fresh"] != identities["tiny"]
    assert old["choices"][0]["text"] != fresh["choices"][0]["text"]
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert again["choices"][0]["text"] == fresh["choices"][0]["text"]


def test_weights_or_a_scale_that_are_not_finite_are_a_400_naming_them(client, replica, adapters, tmp_path):
    root, _ = adapters
    tensor = poisoned(root / "tiny", tmp_path / "nan", float("nan"))
    shutil.copytree(root / "tiny", tmp_path / "inf-alpha")
    config = json.loads((tmp_path / "inf-alpha" / "adapter_config.json").read_text())
    (tmp_path / "inf-alpha" / "adapter_config.json").write_text(json.dumps({**config, "lora_alpha": float("inf")}))
    for path, words in ((tmp_path / "nan", tensor), (tmp_path / "inf-alpha", "lora_alpha")):
        r = client.post("/v1/load_lora_adapter", json={"lora_name": "bad", "lora_path": str(path)},
                        headers=bearer(ADMIN))
        assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
    assert "bad" not in replica.state.loras.names()


def test_an_adapter_loaded_at_runtime_serves_at_once_and_unloads(client, replica, adapters):
    root, refs = adapters
    ids = replica.state.tokenizer.render_completion(STORY)
    t0 = time.monotonic()
    r = client.post("/v1/load_lora_adapter", json={"lora_name": "late", "lora_path": str(root / "late")},
                    headers=bearer(ADMIN))
    assert r.status_code == 200 and "late" in r.text
    body = complete(client, "late", ids)
    assert time.monotonic() - t0 < 10.0  # load call + a first request: no restart, no warm-up
    assert_matches_reference(body, ids, greedy(refs["late"], ids, MAX_TOKENS), replica.state.tokenizer)
    assert client.get("/load").json()["lora"]["adapters"].keys() == {"tiny", "late"}
    r = client.post("/v1/unload_lora_adapter", json={"lora_name": "late"}, headers=bearer(INTERNAL))  # the router
    assert r.status_code == 200, r.text
    r = client.post("/v1/completions", json={"model": "late", "prompt": ids, "max_tokens": 1})
    assert r.status_code == 404 and "late" in r.json()["error"]["message"]


@pytest.mark.parametrize(("key", "status"), [(None, 403), (API, 403)], ids=["no-key", "tenant-key"])
def test_only_the_admin_or_internal_key_loads_adapters(replica, adapters, key, status):
    headers = bearer(key) if key else {}
    r = httpx.post(replica.http.url + "/v1/load_lora_adapter", headers=headers,
                   json={"lora_name": "sneaky", "lora_path": str(adapters[0] / "late")})
    assert r.status_code == status and "admin key" in r.json()["error"]["message"]
    assert "sneaky" not in replica.state.loras.names()


def test_bad_loads_and_unloads_get_clear_errors(client, replica, adapters, tmp_path):
    root, _ = adapters
    no_peft = tmp_path / "not-peft"
    no_peft.mkdir()
    shutil.copy(root / "tiny" / "adapter_config.json", no_peft)  # no weights
    cases = [
        ({"lora_name": "x", "lora_path": str(tmp_path / "missing")}, 400, "not a directory"),
        ({"lora_name": "x", "lora_path": str(no_peft)}, 400, "adapter_model.safetensors"),
        ({"lora_name": "x", "lora_path": str(root / "wide")}, 400, "max_lora_rank"),
        ({"lora_name": "tiny", "lora_path": str(root / "late")}, 409, "already been loaded"),
        ({"lora_name": replica.state.model_name, "lora_path": str(root / "late")}, 409, "base model"),
        ({"lora_name": "x"}, 400, "lora_path"),
    ]
    for body, status, words in cases:
        r = client.post("/v1/load_lora_adapter", json=body, headers=bearer(ADMIN))
        assert r.status_code == status and words in r.json()["error"]["message"], (body, r.text)
    r = client.post("/v1/unload_lora_adapter", json={"lora_name": "nope"}, headers=bearer(ADMIN))
    assert r.status_code == 404 and "cannot be found" in r.json()["error"]["message"]
    assert set(replica.state.loras.names()) == {"tiny"}


def test_load_reports_the_lora_section(client):
    lora = client.get("/load").json()["lora"]
    assert lora["enabled"] is True and lora["max_loras"] == 2 and lora["max_lora_rank"] == 8
    assert lora["adapters"]["tiny"] > 0


def replay(endpoint: str, timeout_ms: int = 5000) -> list:
    """Every batch the publisher still buffers (vLLM's replay protocol), decoded."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, timeout_ms)
    sock.connect(endpoint)
    try:
        sock.send_multipart([b"", pack_seq(0)])
        batches = []
        while (frames := sock.recv_multipart())[-2] != END_SEQ:
            batches.append(decode_batch(frames[-1]))
        return batches
    finally:
        sock.close()
