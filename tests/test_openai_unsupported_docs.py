"""The README's list of unsupported OpenAI parameters is what the servers do: every request in its
table gets a 400 naming the field from the router and from a replica, and every parameter it lists
as accepted-and-ignored is accepted."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest

from . import openai_pair
from .openai_pair import AUTH, HI

pair = openai_pair.pair  # the fixture
README = Path(__file__).resolve().parent.parent / "README.md"
BASE = {"completions": ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 2}),
        "chat": ("/v1/chat/completions", {"messages": HI, "max_tokens": 2})}


def section(name: str) -> str:
    text = README.read_text()
    match = re.search(f"<!-- {name} -->\n(.*?)<!-- /{name} -->", text, re.S)
    assert match, f"README.md has no <!-- {name} --> section"
    return match.group(1)


def refused_rows() -> list[tuple[str, dict, str]]:
    """(endpoint, request fields, param named in the 400) of each row of the README's table."""
    rows = []
    for line in section("unsupported-openai-params").splitlines()[2:]:
        endpoint, fields, answer = (cell.strip() for cell in line.strip("|").split("|"))
        body = json.loads(re.match(r"`(.*?)`", fields).group(1))
        rows.append((endpoint, body, re.fullmatch(r"400 `(\w+)`", answer).group(1)))
    return rows


def ignored_params() -> list[str]:
    return re.findall(r"`(\w+)`", section("ignored-openai-params"))


def test_the_readme_lists_refused_and_ignored_parameters():
    assert len(refused_rows()) >= 10 and len(ignored_params()) >= 4


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
    value = 1 if name != "user" else "someone"
    value = {"k": "v"} if name == "metadata" else value
    for url in pair:
        r = httpx.post(url + path, json={**base, name: value}, headers=AUTH, timeout=60)
        assert r.status_code == 200, (url, name, r.text)
