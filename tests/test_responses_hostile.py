"""Generated hostile ``/v1/responses`` bodies against the router and a replica: every answer is a 4xx or a success,
never a 5xx (the strategies of tests/test_hostile_bodies.py, with the Responses API's fields and input items)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from . import openai_pair
from .openai_pair import AUTH
from .test_hostile_bodies import anything, encode, fresh_client, message, nasty_float, nasty_int, nasty_text, raw_body

pair = openai_pair.pair  # the fixtures
fresh_client = fresh_client

item = st.fixed_dictionaries({}, optional={
    "type": st.one_of(st.sampled_from(["message", "function_call", "function_call_output", "reasoning"]), nasty_text),
    "role": st.one_of(st.sampled_from(["user", "assistant", "system", "developer"]), anything),
    "content": st.one_of(nasty_text, anything, st.lists(st.fixed_dictionaries(
        {"type": st.one_of(st.sampled_from(["input_text", "output_text", "refusal"]), nasty_text),
         "text": anything}), max_size=3)),
    "call_id": st.one_of(nasty_text, anything), "name": st.one_of(nasty_text, anything),
    "arguments": st.one_of(nasty_text, anything), "output": st.one_of(nasty_text, anything)})
fields = {
    "input": st.one_of(nasty_text, st.lists(item, max_size=4), st.lists(message, max_size=3), anything),
    "instructions": st.one_of(nasty_text, anything), "previous_response_id": st.one_of(nasty_text, anything),
    "max_output_tokens": st.one_of(st.integers(-2, 4), nasty_int, anything),  # keep generation short
    "temperature": st.one_of(nasty_float, anything), "top_p": nasty_float, "model": st.one_of(nasty_text, anything),
    "store": anything, "stream": st.booleans(), "tools": anything, "tool_choice": anything, "text": anything,
    "reasoning": anything, "metadata": anything, "include": anything, "background": anything,
    "truncation": anything, "parallel_tool_calls": anything, "user": anything, "stream_options": anything,
}
BASE = {"input": "hi", "max_output_tokens": 2}


def one_bad_field():
    return st.sampled_from(sorted(fields)).flatmap(lambda k: fields[k].map(lambda v: encode({**BASE, k: v})))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(body=st.one_of(raw_body, one_bad_field(), st.fixed_dictionaries(
    {"max_output_tokens": st.integers(1, 3)}, optional={k: v for k, v in fields.items() if k != "max_output_tokens"}
).map(encode)), stream=st.booleans())
def test_no_hostile_responses_body_gets_a_5xx(pair, fresh_client, body, stream):
    for url in pair:
        if stream:
            with fresh_client.stream("POST", url + "/v1/responses", content=body, headers=AUTH) as r:
                text = r.read().decode("utf-8", "replace")
        else:
            r = fresh_client.post(url + "/v1/responses", content=body, headers=AUTH)
            text = r.text
        assert r.status_code < 500, (url, body[:300], text[:500])
        assert '"code":5' not in text.replace(" ", "") and "server_error" not in text, (url, body[:300], text[:500])
        if r.status_code >= 400:
            assert r.json()["error"]["code"] == r.status_code


pytestmark = pytest.mark.slow
