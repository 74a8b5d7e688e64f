"""A token id is a JSON integer, in every field that takes token ids and on both servers: ``true``, ``5.0`` or
``"5"`` in a token-id prompt (flat or batched), ``stop_token_ids``, a chat's ``prompt_token_ids`` or ``/detokenize``'s
``tokens`` are a 400 naming the field, as they are in ``allowed_token_ids`` and every count (protocol.py ``Count``),
never read as the token 1, 0 or 5."""

from __future__ import annotations

import httpx
import pytest

from . import openai_pair
from .openai_pair import AUTH

pair = openai_pair.pair  # the fixture
NOT_IDS = [True, False, 5.0, "5"]


def refused(r: httpx.Response, field: str) -> None:
    assert r.status_code == 400, r.text[:300]
    assert field in r.json()["error"]["message"], r.text[:300]


@pytest.mark.parametrize("value", NOT_IDS, ids=repr)
def test_a_token_id_that_is_not_an_integer_is_a_400(pair, value):
    for url in pair:
        for prompt in ([value, 5], [5, value], [[5], [value]]):
            r = httpx.post(url + "/v1/completions", headers=AUTH, timeout=30,
                           json={"prompt": prompt, "max_tokens": 2})
            refused(r, "prompt")
        r = httpx.post(url + "/v1/completions", headers=AUTH, timeout=30,
                       json={"prompt": "Once", "max_tokens": 2, "stop_token_ids": [value]})
        refused(r, "stop_token_ids")
        r = httpx.post(url + "/detokenize", headers=AUTH, timeout=30, json={"tokens": [5, value]})
        refused(r, "tokens")
    replica, _ = pair  # the router refuses the field whatever it holds (router_only.py)
    r = httpx.post(replica + "/v1/chat/completions", headers=AUTH, timeout=30,
                   json={"messages": openai_pair.HI, "max_tokens": 2, "prompt_token_ids": [5, value]})
    refused(r, "prompt_token_ids")


def test_integer_token_ids_are_served(pair):
    for url in pair:
        r = httpx.post(url + "/v1/completions", headers=AUTH, timeout=30,
                       json={"prompt": [[1, 5], [1, 6]], "max_tokens": 2, "stop_token_ids": [7]})
        assert r.status_code == 200 and len(r.json()["choices"]) == 2, r.text[:300]
        r = httpx.post(url + "/detokenize", headers=AUTH, timeout=30, json={"tokens": [1, 5]})
        assert r.status_code == 200, r.text[:300]
