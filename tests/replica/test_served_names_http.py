"""A replica serving several names (``--served-model-name a b``, vLLM's): each is accepted as the model (an answer
names the model as it was asked for, as for a path form of it), the first is the one /v1/models reports, another
name is a 404 naming the first."""

from __future__ import annotations

import httpx
import pytest
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.openai.config import FrontendConfig
from kvmesh.replica.runtime import ReplicaRuntime
from kvmesh.replica.server.config import ReplicaServerConfig

from ..conftest import CHAT_TEMPLATE


@pytest.fixture(scope="module")
def client(stories_path):
    server = ReplicaServerConfig(port=0, event_port=None, served_model_name=["stories", "tiny-llama"])
    runtime = ReplicaRuntime.start(EngineConfig(model=str(stories_path), kv_cache_memory=4 << 20), server,
                                   frontend=FrontendConfig(chat_template=CHAT_TEMPLATE))
    try:
        with httpx.Client(base_url=runtime.http.url, timeout=60) as c:
            yield c
    finally:
        runtime.shutdown(graceful_s=1)


@pytest.mark.parametrize("model", ["stories", "tiny-llama"])
def test_each_served_name_is_accepted_as_the_model(client, model):
    r = client.post("/v1/completions", json={"model": model, "prompt": "Once upon a time", "max_tokens": 2})
    assert r.status_code == 200, r.text
    assert r.json()["model"] == model


def test_models_lists_the_first_name_and_another_name_is_a_404_naming_it(client):
    assert [card["id"] for card in client.get("/v1/models").json()["data"]] == ["stories"]
    r = client.post("/v1/completions", json={"model": "other", "prompt": "Once", "max_tokens": 2})
    assert r.status_code == 404 and "serves `stories`" in r.json()["error"]["message"]
