"""One router in front of fake replicas of two base models: each model is answered from its own pool,
an unknown one gets 404, /v1/models lists both and their adapters, and an adapter's request goes to a replica
that lacks it only after the router loaded it there, with the cluster's internal key."""

from __future__ import annotations

import httpx
import pytest

from .conftest import ADMIN, launched_fakes, replica_rows, wait_for

INTERNAL_KEY = "internal-key-for-the-models-test"


@pytest.fixture(scope="module")
def two_model_fakes():
    with launched_fakes("a1", "a2", "b1", models=("llama", "llama", "qwen")) as procs:
        yield procs


def complete(router, model: str | None, **extra) -> httpx.Response:
    body = {"prompt": "Once upon a time there was a", "max_tokens": 2, **extra}
    if model is not None:
        body["model"] = model
    return httpx.post(router.url + "/v1/completions", json=body, timeout=10)


def answered_by(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


def test_each_model_from_its_own_pool_adapters_loaded_where_missing(two_model_fakes, start_router, tmp_path):
    a1, a2, b1 = two_model_fakes
    router = start_router([a1.spec, a2.spec, b1.spec], internal_key=INTERNAL_KEY)
    models = router.runtime.models
    wait_for(lambda: len(router.runtime.router.healthy) == 3 and set(models.catalog.bases()) == {"llama", "qwen"},
             what="three healthy replicas reporting two models")

    assert {answered_by(complete(router, "llama")) for _ in range(8)} <= {"a1", "a2"}
    assert {answered_by(complete(router, "qwen")) for _ in range(4)} == {"b1"}
    unknown = complete(router, "gpt-4")
    assert unknown.status_code == 404 and "The model `gpt-4` does not exist" in unknown.json()["error"]["message"]
    nameless = complete(router, None)
    assert nameless.status_code == 400 and "`model`" in nameless.json()["error"]["message"]

    # the admin loads an adapter of llama: every llama replica gets it, with the internal key; qwen's does not
    adapter_dir = tmp_path / "tiny"
    adapter_dir.mkdir()
    body = {"lora_name": "tiny", "lora_path": str(adapter_dir), "base_model_name": "llama"}
    assert httpx.post(router.url + "/v1/load_lora_adapter", json=body, timeout=10).status_code == 403  # tenants
    r = httpx.post(router.url + "/v1/load_lora_adapter", json=body, headers=ADMIN, timeout=10)
    assert r.status_code == 200, r.text
    assert sorted(r.json()["loaded_on"]) == ["a1", "a2"]
    for fake in (a1, a2):
        (call,) = [c for c in httpx.get(fake.info["url"] + "/fake/stats", timeout=5).json()["adapter_calls"]
                   if c["lora_name"] == "tiny"]
        assert call["auth"] == f"Bearer {INTERNAL_KEY}" and call["lora_path"] == str(adapter_dir)
    assert not httpx.get(b1.info["url"] + "/fake/stats", timeout=5).json()["adapter_calls"]
    cards = {c["id"]: c for c in httpx.get(router.url + "/v1/models", timeout=5).json()["data"]}
    assert set(cards) == {"llama", "qwen", "tiny"} and cards["tiny"]["parent"] == "llama"
    assert cards["llama"]["parent"] is None and cards["tiny"]["root"] == "tiny"  # a tenant sees no host path
    admin_cards = {c["id"]: c for c in httpx.get(router.url + "/v1/models", headers=ADMIN).json()["data"]}
    assert admin_cards["tiny"]["root"] == str(adapter_dir)
    assert {answered_by(complete(router, "tiny")) for _ in range(6)} <= {"a1", "a2"}
    rows = {row["id"]: row for row in replica_rows(router)}  # the admin's view: what each replica serves
    assert {rid: (row["model"], row.get("adapters", [])) for rid, row in rows.items()} == {
        "a1": ("llama", ["tiny"]), "a2": ("llama", ["tiny"]), "b1": ("qwen", [])}

    # an adapter the router knows but no replica has yet: loaded on the chosen replica before its request
    models.catalog.learn_adapter("sql", str(adapter_dir), "llama")
    replica = answered_by(complete(router, "sql"))
    fake = a1 if replica == "a1" else a2
    loads = [c for c in httpx.get(fake.info["url"] + "/fake/stats", timeout=5).json()["adapter_calls"]
             if c["lora_name"] == "sql"]
    assert len(loads) == 1 and loads[0]["auth"] == f"Bearer {INTERNAL_KEY}"
    assert answered_by(complete(router, "sql")) in {"a1", "a2"}

    # one whose load fails everywhere: a 502 naming the adapter and the replicas' reasons, never a 5xx of a replica
    models.catalog.learn_adapter("broken", str(tmp_path / "missing"), "llama")
    failed = complete(router, "broken")
    assert failed.status_code == 502, failed.text
    message = failed.json()["error"]["message"]
    assert "adapter `broken` could not be loaded" in message and "HTTP 400" in message

    r = httpx.post(router.url + "/v1/unload_lora_adapter", json={"lora_name": "tiny"}, headers=ADMIN, timeout=10)
    assert r.status_code == 200 and sorted(r.json()["unloaded_from"]) == ["a1", "a2"]
    assert complete(router, "tiny").status_code == 404


def test_an_adapter_load_slower_than_the_connect_timeout_is_waited_for(two_model_fakes, start_router, tmp_path):
    """An adapter load gets ``upstream.adapter_load_timeout_s`` (30 s), not the connect timeout the router's other
    control calls get (1 s here): a large adapter or a slow disk is no failure."""
    a1, a2, b1 = two_model_fakes
    router = start_router([a1.spec, a2.spec, b1.spec], internal_key=INTERNAL_KEY)
    wait_for(lambda: len(router.runtime.router.healthy) == 3, what="three healthy replicas")
    for fake in (a1, a2):
        fake.configure(adapter_load_delay=2.5)
    try:
        body = {"lora_name": "large", "lora_path": str(tmp_path), "base_model_name": "llama"}
        r = httpx.post(router.url + "/v1/load_lora_adapter", json=body, headers=ADMIN, timeout=60)
        assert r.status_code == 200, r.text
        assert sorted(r.json()["loaded_on"]) == ["a1", "a2"]
    finally:
        for fake in (a1, a2):
            fake.configure(adapter_load_delay=0.0)
