"""The lists of OpenAI parameters in docs/openai-api.md are what the servers do: every request in its refused table
gets a 400 naming the field from the router and from a replica, every parameter it lists as
accepted-and-ignored is accepted, and every request in its supported table is served as asked."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest

from . import openai_pair
from .openai_pair import AUTH, HI

pair = openai_pair.pair  # the fixture
API_DOC = Path(__file__).resolve().parent.parent / "docs" / "openai-api.md"
BASE = {"completions": ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 2}),
        "chat": ("/v1/chat/completions", {"messages": HI, "max_tokens": 2})}


def section(name: str) -> str:
    text = API_DOC.read_text()
    match = re.search(f"<!-- {name} -->\n(.*?)<!-- /{name} -->", text, re.S)
    assert match, f"docs/openai-api.md has no <!-- {name} --> section"
    return match.group(1)


def refused_rows() -> list[tuple[str, dict, str]]:
    """(endpoint, request fields, param named in the 400) of each row of the doc's refused table."""
    rows = []
    for line in section("unsupported-openai-params").splitlines()[2:]:
        endpoint, fields, answer = (cell.strip() for cell in line.strip("|").split("|"))
        body = json.loads(re.match(r"`(.*?)`", fields).group(1))
        rows.append((endpoint, body, re.fullmatch(r"400 `(\w+)`", answer).group(1)))
    return rows


IGNORED_VALUES = {"user": "someone", "metadata": {"k": "v"}, "session_id": "session-1",
                  "spaces_between_special_tokens": False, "return_token_offsets": True, "return_mm_kwargs": False,
                  "service_tier": "flex", "store": True}
"""A value each ignored parameter is sent with (1 for the others)."""


def ignored_params() -> list[str]:
    return re.findall(r"`(\w+)`", section("ignored-openai-params"))


def supported_rows() -> list[tuple[str, dict]]:
    """(endpoint, request fields) of each row of the doc's supported table."""
    rows = []
    for line in section("supported-openai-params").splitlines()[2:]:
        endpoint, fields = (cell.strip() for cell in line.strip("|").split("|"))
        rows.append((endpoint, json.loads(re.match(r"`(.*?)`", fields).group(1))))
    return rows


def test_the_doc_lists_refused_ignored_and_supported_parameters():
    assert len(refused_rows()) >= 4 and len(ignored_params()) >= 4 and len(supported_rows()) >= 9


@pytest.mark.parametrize("endpoint, fields, param", refused_rows(), ids=lambda v: json.dumps(v)[:40])
def test_each_listed_request_is_refused_naming_its_field(pair, endpoint, fields, param):
    path, base = BASE[endpoint]
    for url in pair:
        r = httpx.post(url + path, json={**base, **fields}, headers=AUTH, timeout=60)
        assert r.status_code == 400, (url, r.text)
        error = r.json()["error"]
        assert error["param"] == param or param in error["message"], (url, error)


@pytest.mark.parametrize("name", ignored_params())
def test_each_listed_ignored_parameter_is_accepted(pair, name):
    path, base = BASE["completions"]
    value = IGNORED_VALUES.get(name, 1)
    for url in pair:
        r = httpx.post(url + path, json={**base, name: value}, headers=AUTH, timeout=60)
        assert r.status_code == 200, (url, name, r.text)


@pytest.mark.parametrize("endpoint, fields", supported_rows(), ids=lambda v: json.dumps(v)[:40])
def test_each_listed_supported_request_is_served_as_asked(pair, endpoint, fields):
    path, base = BASE[endpoint]
    body = {**base, **fields}
    num_prompts = len(body["prompt"]) if isinstance(body.get("prompt"), list) else 1
    for url in pair:
        r = httpx.post(url + path, json=body, headers=AUTH, timeout=60)
        assert r.status_code == 200, (url, r.text)
        choices = r.json()["choices"]
        assert sorted(c["index"] for c in choices) == list(range(num_prompts * body.get("n", 1)))
        for choice in choices:
            assert (choice["logprobs"] is not None) == bool(body.get("logprobs")), (url, choice)
            if body.get("echo"):
                assert choice["text"].startswith(body["prompt"])
