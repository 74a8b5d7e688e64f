"""An adapter's prompt moves between replicas under the adapter's hashes: a P/D handle taken by a prefill run with
``"model": "tiny"`` is pulled by the decode side's ``"tiny"`` request, and its blocks never serve the base model
(real stories260K replicas, ``local`` transport, real HTTP)."""

from __future__ import annotations

import random

import pytest

from .kv_replicas import client, kv_replica, register
from .lora_fixtures import make_adapter

pytest.importorskip("peft")


@pytest.fixture(scope="module")
def pair(stories_path, tmp_path_factory):
    """(holder A, puller B), both serving adapter ``tiny``, B with A registered as its peer."""
    adapter = tmp_path_factory.mktemp("adapter") / "tiny"
    make_adapter(stories_path, adapter, seed=5)
    lora = {"enable_lora": True, "max_lora_rank": 8, "lora_modules": {"tiny": str(adapter)}, "dtype": "float32"}
    with kv_replica(stories_path, replica_id="a", **lora) as a, kv_replica(stories_path, replica_id="b", **lora) as b:
        register(b, a)
        yield a, b


def complete(c, prompt, model, max_tokens=8, **extra):
    r = c.post("/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                                        "ignore_eos": True, **extra})
    assert r.status_code == 200, r.text
    return r


def test_a_pd_handle_of_an_adapters_prompt_is_pulled_for_that_adapter_only(pair):
    a, b = pair
    prompt = [random.Random(39).randrange(3, 500) for _ in range(100)]  # 6 full blocks of 16
    with client(a) as ca, client(b) as cb:
        handle = complete(ca, prompt, "tiny", max_tokens=1, kv_transfer_params={"do_remote_decode": True}).json()[
            "kv_transfer_params"]
        assert handle["num_tokens"] == 96
        r = complete(cb, prompt, "tiny", kv_transfer_params={**handle, "remote_url": a.http.url})
        assert r.headers["x-kvmesh-kv-pull"] == "ok" and r.headers["x-kvmesh-kv-pulled-tokens"] == "96"
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 96
        assert r.json()["choices"][0]["text"] == complete(ca, prompt, "tiny").json()["choices"][0]["text"]
        base = complete(cb, prompt, a.state.model_name).json()
        assert base["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # the adapter's blocks are its own
