"""Hostile: one completion request asking for more sequences than a request may run. A batch of 128 prompts with
``n: 128`` is 16,384 sequences: two such requests (3 KB each) filled every replica's queue for minutes while another
tenant's 16-token completion waited 244 s behind them (the router admits requests, and each was one). So prompts x
``max(n, best_of)`` is bounded by MAX_CHOICES (OpenAI's limit on ``n``), a 400 naming the field, router and replica
alike; a batch of prompts with ``n: 1`` and one prompt with ``n: 128`` are served as before."""

from __future__ import annotations

import httpx
import pytest
from kvmesh.replica.openai.sampling_fields import MAX_CHOICES

from . import openai_pair
from .openai_pair import AUTH

pair = openai_pair.pair  # the fixture


def post(url: str, body: dict) -> httpx.Response:
    return httpx.post(url + "/v1/completions", headers=AUTH, timeout=60, json={"max_tokens": 1, **body})


@pytest.mark.parametrize("prompts, fields, param", [
    (MAX_CHOICES, {"n": MAX_CHOICES}, "n"),
    (2, {"n": MAX_CHOICES // 2 + 1}, "n"),
    (2, {"n": 1, "best_of": MAX_CHOICES}, "best_of"),
])
def test_prompts_times_choices_over_the_limit_is_a_400(pair, prompts, fields, param):
    body = {"prompt": [[1, 5 + i] for i in range(prompts)], **fields}
    for url in pair:
        r = post(url, body)
        assert r.status_code == 400, r.text[:300]
        error = r.json()["error"]
        assert error["param"] == param and str(MAX_CHOICES) in error["message"], error
        assert str(prompts * max(fields["n"], fields.get("best_of", 1))) in error["message"], error


def test_requests_within_the_limit_are_served(pair):
    for url in pair:
        for body, choices in (({"prompt": [[1, 5 + i] for i in range(MAX_CHOICES)]}, MAX_CHOICES),
                              ({"prompt": [1, 5], "n": MAX_CHOICES}, MAX_CHOICES),
                              ({"prompt": [[1, 5], [1, 6]], "n": MAX_CHOICES // 2}, MAX_CHOICES)):
            r = post(url, body)
            assert r.status_code == 200 and len(r.json()["choices"]) == choices, r.text[:300]
