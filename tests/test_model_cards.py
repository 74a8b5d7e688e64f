"""`/v1/models` and `GET /v1/models/{id}` in vLLM's shape, the same on the router and the replica."""

from __future__ import annotations

import httpx

from . import openai_pair
from .openai_pair import AUTH
from .test_openai_parity import error_shape

pair = openai_pair.pair  # the fixture
VLLM_CARD_KEYS = {"id", "object", "created", "owned_by", "root", "parent", "max_model_len", "permission"}


def get(url: str, path: str) -> httpx.Response:
    return httpx.get(url + path, headers=AUTH, timeout=30)


def test_router_and_replica_model_lists_carry_vllms_fields(pair):
    replica, router = (get(url, "/v1/models").json()["data"][0] for url in pair)
    assert set(replica) == set(router) == VLLM_CARD_KEYS
    assert router["max_model_len"] == replica["max_model_len"] > 0
    assert router["parent"] is None and isinstance(router["created"], int)
    assert router["permission"][0]["object"] == "model_permission"
    assert router["root"] == router["id"] == "stories"  # a tenant sees the served name, never a host path


def test_get_one_model_answers_its_card_on_both(pair):
    replica, router = (get(url, "/v1/models/stories") for url in pair)
    assert replica.status_code == router.status_code == 200, (replica.text, router.text)
    assert replica.json()["id"] == router.json()["id"] == "stories"
    assert set(router.json()) == VLLM_CARD_KEYS


def test_get_an_unknown_model_is_the_same_404_on_both(pair):
    replica, router = (get(url, "/v1/models/gpt-9") for url in pair)
    assert replica.status_code == router.status_code == 404
    assert error_shape(replica) == error_shape(router)
    assert "gpt-9" in router.json()["error"]["message"]
