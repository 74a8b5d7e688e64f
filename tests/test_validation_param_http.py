"""A body whose value has the wrong type or shape is a 400 whose ``param`` names the top-level field, as OpenAI's
errors do (``openai.BadRequestError.param``), on the router and the replica alike: the message says what was wrong
inside it (``messages.0.role: ...``)."""

from __future__ import annotations

import httpx
import pytest

from . import openai_pair
from .openai_pair import AUTH

pair = openai_pair.pair  # the fixture

CASES = [
    ("/v1/completions", {"prompt": "Once", "n": True}, "n"),
    ("/v1/completions", {"prompt": "Once", "max_tokens": 2.5}, "max_tokens"),
    ("/v1/completions", {"prompt": [1.5]}, "prompt"),
    ("/v1/completions", {"prompt": "Once", "priority": 2**40}, "priority"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, "messages"),
    ("/v1/chat/completions", {"messages": openai_pair.HI, "logprobs": "yes"}, "logprobs"),
    ("/tokenize", {"prompt": 5}, "prompt"),
]


@pytest.mark.parametrize("path, body, field", CASES, ids=[c[2] for c in CASES])
def test_a_wrongly_typed_value_is_a_400_whose_param_names_its_field(pair, path, body, field):
    for url in pair:
        r = httpx.post(url + path, headers=AUTH, timeout=30, json={"max_tokens": 2, **body})
        assert r.status_code == 400, r.text[:300]
        error = r.json()["error"]
        assert error["param"] == field and error["message"].startswith(f"invalid request: {field}"), error
