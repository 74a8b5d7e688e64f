"""A client's bad input is the client's error, on a replica and through a router in front of it: each cheap input
of tests/client_error_inputs.py (a schema or grammar no text matches, a constraint that ``min_tokens`` or
``allowed_token_ids`` leaves no token, a tool whose parameters are such a schema) is a 400 naming the field when
answered whole, and a stream of it ends its choice with ``finish_reason: "error"`` -- never a 500."""

from __future__ import annotations

import httpx
import pytest

from . import openai_pair
from .client_error_inputs import CLIENT_ERRORS, body, ended_as_the_requests_error, path
from .openai_pair import AUTH

pytest.importorskip("xgrammar", reason="structured outputs need xgrammar (the engine extra)")

pair = openai_pair.pair  # the fixture


@pytest.mark.parametrize("name, kind, fields, param", CLIENT_ERRORS, ids=[c[0] for c in CLIENT_ERRORS])
def test_a_cheap_bad_input_is_the_requests_error_never_a_500(pair, name, kind, fields, param):
    for url in pair:
        for stream in (False, True):
            r = httpx.post(url + path(kind), headers=AUTH, json=body(kind, fields, stream), timeout=60)
            wrong = ended_as_the_requests_error(r.status_code, r.text, stream, param)
            assert wrong is None, (url, stream, wrong)
            if not stream and name not in ("tool_choice_names_a_missing_tool",):
                assert param in r.json()["error"]["message"], r.text


def test_the_400_says_what_to_change(pair):
    """The message names the fields that meet and what to do about them."""
    replica, _ = pair
    _, kind, fields, _ = next(c for c in CLIENT_ERRORS if c[0] == "choice_with_min_tokens")
    error = httpx.post(replica + path(kind), headers=AUTH, json=body(kind, fields, False), timeout=60).json()["error"]
    assert error["type"] == "invalid_request_error" and "min_tokens=5" in error["message"]
    assert "lower min_tokens" in error["message"]
    _, kind, fields, _ = next(c for c in CLIENT_ERRORS if c[0] == "grammar_root_is_root")
    error = httpx.post(replica + path(kind), headers=AUTH, json=body(kind, fields, False), timeout=60).json()["error"]
    assert "allows no token" in error["message"] and error["code"] == 400


def test_a_valid_constraint_still_answers(pair):
    """The refusal check runs only on a refused token: a constraint the model can follow is served as before."""
    for url in pair:
        r = httpx.post(url + "/v1/completions", headers=AUTH, timeout=60,
                       json={"prompt": "Once upon", "max_tokens": 16, "structured_outputs": {"choice": ["yes", "no"]},
                             "min_tokens": 1})
        assert r.status_code == 200 and r.json()["choices"][0]["text"] in ("yes", "no"), r.text
