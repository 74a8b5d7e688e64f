"""`POST /detokenize` (vLLM's body and answer) on the replica and on the router, from one implementation."""

from __future__ import annotations

import json

import pytest

from . import openai_pair
from .test_openai_parity import both, error_shape

pair = openai_pair.pair  # the fixture


def test_detokenize_turns_tokenize_back_into_the_prompt_on_both(pair):
    ids = both(pair, "/tokenize", json.dumps({"prompt": "Once upon a time", "add_special_tokens": False}))[0]
    tokens = ids.json()["tokens"]
    replica, router = both(pair, "/detokenize", json.dumps({"tokens": tokens}))
    assert replica.status_code == router.status_code == 200, (replica.text, router.text)
    assert replica.json() == router.json() == {"prompt": "Once upon a time"}


@pytest.mark.parametrize("body, param", [
    ({}, "tokens"),
    ({"tokens": [1, 100000]}, "tokens"),
    ({"tokens": [1, -3]}, "tokens"),
    ({"tokens": "hi"}, "tokens"),
    ({"tokens": [1], "model": "gpt-9"}, "model"),
])
def test_bad_detokenize_bodies_are_the_same_400_on_both(pair, body, param):
    replica, router = both(pair, "/detokenize", json.dumps(body))
    assert error_shape(replica) == error_shape(router)
    assert replica.status_code in (400, 404) and param in replica.json()["error"]["message"], replica.text
