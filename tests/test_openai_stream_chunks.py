"""Streamed chunks as vLLM sends them, from a replica and through the router: every mid-stream chunk
carries text (a token that adds none -- <unk>, half a UTF-8 character -- makes no chunk of its own); a
delta has no null fields; the streamed text is the non-streamed text."""

from __future__ import annotations

import json

import httpx
import pytest

from . import openai_pair
from .openai_pair import AUTH

pair = openai_pair.pair  # the fixture

STORY = "Once upon a time there was a little girl named Lily. She"
SAMPLING = {
    "story": {"temperature": 1.0, "seed": 7},
    "unk_only": {"temperature": 0, "logit_bias": {"0": 100}},  # every token <unk>, which decodes to no text
    "some_unk": {"temperature": 1.0, "seed": 3, "logit_bias": {"0": 9}},
}
SIDES = pytest.mark.parametrize("side", [0, 1], ids=["replica", "router"])


def _stream(url: str, path: str, body: dict) -> list[dict]:
    with httpx.stream("POST", url + path, json={**body, "stream": True}, headers=AUTH, timeout=60) as response:
        assert response.status_code == 200, response.read()
        events = [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


@SIDES
@pytest.mark.parametrize("sampling", list(SAMPLING))
def test_chat_stream_sends_no_textless_chunks_and_no_null_fields(pair, side, sampling):
    body = {"model": "stories", "messages": [{"role": "user", "content": STORY}], "max_tokens": 64,
            **SAMPLING[sampling]}
    chunks = _stream(pair[side], "/v1/chat/completions", body)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert all(set(d) == {"content"} and isinstance(d["content"], str) for d in deltas[1:]), deltas
    assert all(d["content"] for d in deltas[1:-1]), "a mid-stream chunk without text"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    whole = httpx.post(pair[side] + "/v1/chat/completions", json=body, headers=AUTH, timeout=60).json()
    assert "".join(d["content"] for d in deltas) == whole["choices"][0]["message"]["content"]


@SIDES
@pytest.mark.parametrize("sampling", list(SAMPLING))
def test_completion_stream_sends_no_textless_chunks_mid_stream(pair, side, sampling):
    body = {"model": "stories", "prompt": STORY, "max_tokens": 64, **SAMPLING[sampling]}
    chunks = _stream(pair[side], "/v1/completions", body)
    assert all(c["choices"][0]["text"] for c in chunks[:-1]), "a mid-stream chunk without text"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    whole = httpx.post(pair[side] + "/v1/completions", json=body, headers=AUTH, timeout=60).json()
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
