"""The Responses API's details over HTTP, on a replica and through a router (openai_pair): a stream whose tool schema
no text matches fails with the same client error as the unstreamed 400 (never a server error to retry); an answer
cut at ``max_output_tokens`` leaves its message ``incomplete``; the openai SDK lists a stored response's input
items, its owner's only."""

from __future__ import annotations

import json

import httpx
import pytest

from . import openai_pair
from .openai_pair import AUTH, KEY

pair = openai_pair.pair  # the fixture
openai = pytest.importorskip("openai", reason="the OpenAI Python client is a dev dependency (pip install -e .[dev])")

NO_TEXT = {"$ref": "#"}
"""A schema no text matches: its grammar's language is empty."""
FORCED = {"input": "hi", "max_output_tokens": 8, "tools": [{"type": "function", "name": "f", "parameters": NO_TEXT}],
          "tool_choice": {"type": "function", "name": "f"}}


def events(text: str) -> list[dict]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


def test_a_streamed_client_error_is_the_unstreamed_400_not_a_server_error(pair):
    for url in pair:
        whole = httpx.post(url + "/v1/responses", json=FORCED, headers=AUTH, timeout=60)
        assert whole.status_code == 400, whole.text
        error = whole.json()["error"]
        streamed = httpx.post(url + "/v1/responses", json={**FORCED, "stream": True}, headers=AUTH, timeout=60)
        assert streamed.status_code in (200, 400), streamed.text
        if streamed.status_code == 400:  # refused before the stream began: the same error
            assert streamed.json()["error"]["message"] == error["message"]
            continue
        got = events(streamed.text)
        assert [e["type"] for e in got][-2:] == ["error", "response.failed"], (url, streamed.text[-600:])
        assert got[-2]["message"] == error["message"] and got[-2]["code"] == error["type"], (url, got[-2], error)
        assert got[-1]["response"]["error"] == {"code": "invalid_prompt", "message": error["message"]}
        assert "server_error" not in streamed.text and "retry" not in streamed.text, url


def sdk(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=60)


def test_an_answer_cut_at_max_output_tokens_has_an_incomplete_message(pair):
    for url in pair:
        r = sdk(url).responses.create(model="stories", input="Once upon a time", max_output_tokens=3, temperature=0)
        assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
        assert r.output[-1].type == "message" and r.output[-1].status == "incomplete", url


def test_the_sdk_lists_a_stored_responses_input_items(pair):
    for url in pair:
        client = sdk(url)
        r = client.responses.create(model="stories", max_output_tokens=2, temperature=0, input=[
            {"role": "system", "content": "be brief"}, {"role": "user", "content": "Once upon a time"}])
        items = list(client.responses.input_items.list(r.id))
        assert [(i.type, i.role) for i in items] == [("message", "user"), ("message", "system")], url
        assert items[0].content[0].text == "Once upon a time"
        page = client.responses.input_items.list(r.id, order="asc", limit=1)
        assert [i.role for i in page.data] == ["system"] and page.has_more is True
        assert [i.role for i in client.responses.input_items.list(r.id, order="asc", after=page.last_id).data] == \
            ["user"]
        with pytest.raises(openai.NotFoundError):
            client.responses.input_items.list("resp_" + "0" * 32)
        bad = httpx.get(f"{url}/v1/responses/{r.id}/input_items?limit=0", headers=AUTH, timeout=30)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "limit", bad.text
