"""Hostile: the lists a request hands the engine, whose cost is paid on the engine thread for every token of every
choice, while every other tenant's requests wait for the step. A stop list is matched against each new token's text
string by string, so its length is bounded (a 400 naming ``stop`` and the limit, from the router and the replica);
token-id lists (``allowed_token_ids``, ``stop_token_ids``) are sets of the vocabulary's ids, so a list repeating
its ids costs what its distinct ids cost, and is answered at once with the same tokens."""

from __future__ import annotations

import time

import httpx
from kvmesh.replica.serving.sampling_params import MAX_STOP_STRINGS

from . import openai_pair
from .openai_pair import AUTH

pair = openai_pair.pair  # the fixture


def post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(url + path, headers=AUTH, timeout=60, json={"max_tokens": 4, **body})


def test_a_stop_list_over_the_limit_is_a_400_naming_stop_and_the_limit(pair):
    stops = [f"zq{i}" for i in range(MAX_STOP_STRINGS + 1)]
    for url in pair:
        for path, body in (("/v1/completions", {"prompt": "Once"}), ("/v1/chat/completions",
                                                                      {"messages": openai_pair.HI})):
            r = post(url, path, {**body, "stop": stops})
            assert r.status_code == 400, r.text[:300]
            error = r.json()["error"]
            assert error["param"] == "stop" and str(MAX_STOP_STRINGS) in error["message"], error


def test_a_stop_list_at_the_limit_is_served(pair):
    for url in pair:
        r = post(url, "/v1/completions", {"prompt": "Once", "stop": [f"zq{i}" for i in range(MAX_STOP_STRINGS)]})
        assert r.status_code == 200, r.text[:300]


def test_repeated_token_ids_cost_what_their_distinct_ids_cost(pair):
    """150,000 ids naming 100 tokens (and 30,000 stop ids, banned until ``min_tokens``), for 16 choices of 32 tokens:
    served at once, every token one of them (the
    engine once rebuilt each row's list for every step: seconds per token, every other request stalled)."""
    allowed = list(range(300, 400))
    ids, stop_ids = allowed * 1500, list(range(400, 500)) * 300
    for url in pair:
        start = time.monotonic()
        r = post(url, "/v1/completions", {"prompt": "Once", "n": 16, "max_tokens": 32, "ignore_eos": True,
                                          "allowed_token_ids": ids, "stop_token_ids": stop_ids,
                                          "min_tokens": 32, "logprobs": 0,
                                          "return_tokens_as_token_ids": True})
        took = time.monotonic() - start
        assert r.status_code == 200, r.text[:300]
        choices = r.json()["choices"]
        names = {f"token_id:{t}" for t in allowed}
        assert len(choices) == 16 and all(set(c["logprobs"]["tokens"]) <= names for c in choices), choices[0]
        assert took < 10.0, f"{took:.1f} s for 16 choices of 32 tokens"
