"""Which "model" a router serves (vLLM's rule): its served name, or the model path a replica also accepts;
another name is a 404 naming the served one; a request without "model" is served."""

from __future__ import annotations

import httpx
import pytest
from kvmesh.replica.serving.tokenizer import load_tokenizer
from kvmesh.router.config import RouterConfig
from kvmesh.router.control.router_server import RouterServer


@pytest.fixture(scope="module")
def router(stories_path):
    server = RouterServer(RouterConfig(port=0, model=str(stories_path), served_model_name="../models/stories"), [],
                          tokenizer=load_tokenizer(stories_path)).start()
    yield server
    server.stop()


def _render(router, **model) -> httpx.Response:
    return httpx.post(router.url + "/v1/completions/render", json={"prompt": "hi", **model}, timeout=10)


def test_the_served_name_as_given_the_model_path_and_no_name_are_served(router, stories_path):
    for model in ({"model": "../models/stories"}, {"model": str(stories_path)}, {}):
        assert _render(router, **model).status_code == 200, model


def test_another_name_is_a_404_that_names_the_served_one(router):
    r = _render(router, model="stories")
    assert r.status_code == 404 and "serves `../models/stories`" in r.json()["error"]["message"]


def test_several_served_names_are_each_served_and_the_first_is_reported(stories_path):
    config = RouterConfig(port=0, model=str(stories_path), served_model_name=["stories", "tiny-llama"])
    server = RouterServer(config, [], tokenizer=load_tokenizer(stories_path)).start()
    try:
        for model in ("stories", "tiny-llama", str(stories_path)):
            assert _render(server, model=model).status_code == 200, model
        r = _render(server, model="other")
        assert r.status_code == 404 and "serves `stories`" in r.json()["error"]["message"]
        assert [card["id"] for card in httpx.get(server.url + "/v1/models", timeout=10).json()["data"]] == ["stories"]
    finally:
        server.stop()
