"""What each implemented request field visibly does, one probe a field (tests/test_vllm_request_fields.py walks them).

A probe gets ``ask(fields) -> httpx.Response`` (the endpoint's base request, greedy and short, with ``fields``
merged in, sent to one server) and asserts the field's effect against the same request without it. Fields whose
effect one request cannot show (priority, cache_salt) are shown read: a value of the wrong kind is a 400 naming
them, where an ignored field would be a 200.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx

Ask = Callable[[dict], httpx.Response]
HI_ONLY = [{"role": "user", "content": "hi"}]
EOS = "2"  # stories260K's </s>; a +100 logit_bias makes the model end at once
FORCE_EOS = {"logit_bias": {EOS: 100}}


def ok(r: httpx.Response) -> dict:
    assert r.status_code == 200, r.text
    return r.json()


def text(body: dict) -> str:
    choice = body["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


def events(r: httpx.Response) -> list[dict]:
    assert r.status_code == 200, r.text
    lines = [line[len("data: "):] for line in r.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]", r.text[-200:]
    return [json.loads(line) for line in lines[:-1]]


def refused(r: httpx.Response, name: str) -> bool:
    if r.status_code not in (400, 403, 404):
        return False
    error = r.json()["error"]
    return error.get("param") == name or name in error["message"]


def read_as(name: str, wrong: object) -> Callable[[Ask], None]:
    """The field is read: a value of the wrong kind is a 400 naming it."""
    def probe(ask: Ask) -> None:
        assert refused(ask({name: wrong}), name)
    return probe


def changes_text(name: str, value: object, base: dict | None = None) -> Callable[[Ask], None]:
    def probe(ask: Ask) -> None:
        assert text(ok(ask({**(base or {}), name: value}))) != text(ok(ask(base or {})))
    return probe


def changes_prompt_tokens(name: str, value: object) -> Callable[[Ask], None]:
    def probe(ask: Ask) -> None:
        assert ok(ask({name: value}))["usage"]["prompt_tokens"] != ok(ask({}))["usage"]["prompt_tokens"]
    return probe


def limits_tokens(name: str) -> Callable[[Ask], None]:
    def probe(ask: Ask) -> None:
        assert ok(ask({name: 2, "ignore_eos": True}))["usage"]["completion_tokens"] == 2
    return probe


def _ignore_eos(ask: Ask) -> None:
    assert ok(ask(FORCE_EOS))["usage"]["completion_tokens"] == 1
    body = ok(ask({**FORCE_EOS, "ignore_eos": True, "max_tokens": 4, "max_completion_tokens": 4}))
    assert body["usage"]["completion_tokens"] == 4 and body["choices"][0]["finish_reason"] == "length"


def _min_tokens(ask: Ask) -> None:
    assert ok(ask({**FORCE_EOS, "min_tokens": 3}))["usage"]["completion_tokens"] >= 3


def _skip_special_tokens(ask: Ask) -> None:
    base = {**FORCE_EOS, "ignore_eos": True}
    assert "</s>" not in text(ok(ask(base)))
    assert "</s>" in text(ok(ask({**base, "skip_special_tokens": False})))


def _a_word(ask: Ask) -> str:
    """A word of the greedy answer past its start (the stop string the stop probes use)."""
    words = text(ok(ask({}))).split()
    assert len(words) >= 3, words
    return words[2]


def _stop(ask: Ask) -> None:
    word = _a_word(ask)
    body = ok(ask({"stop": [word]}))
    assert word not in text(body) and body["choices"][0]["finish_reason"] == "stop"


def _include_stop_str_in_output(ask: Ask) -> None:
    word = _a_word(ask)
    assert text(ok(ask({"stop": [word], "include_stop_str_in_output": True}))).endswith(word)
    assert not text(ok(ask({"stop": [word]}))).endswith(word)


def _stop_token_ids(ask: Ask) -> None:
    ids = _token_ids(ask, {})
    body = ok(ask({"stop_token_ids": [ids[3]]}))
    assert body["choices"][0]["finish_reason"] == "stop" and body["usage"]["completion_tokens"] <= 4


def _token_ids(ask: Ask, fields: dict) -> list[int]:
    chunks = events(ask({**fields, "stream": True, "return_token_ids": True}))
    return [t for chunk in chunks for c in chunk["choices"] for t in c.get("token_ids") or []]


def _allowed_token_ids(ask: Ask) -> None:
    allowed = [261, 378, 383]  # stories260K's " a", " time", " there"
    for sampled in ({}, {"temperature": 1.0, "seed": 4}):
        ids = _token_ids(ask, {**sampled, "allowed_token_ids": allowed, "ignore_eos": True})
        assert len(ids) == 8 and set(ids) <= set(allowed)
    assert refused(ask({"allowed_token_ids": [10**6]}), "allowed_token_ids")  # outside the vocabulary


def _return_token_ids(ask: Ask) -> None:
    assert len(_token_ids(ask, {})) == ok(ask({}))["usage"]["completion_tokens"]
    assert not any("token_ids" in c for chunk in events(ask({"stream": True})) for c in chunk["choices"])


def _stream(ask: Ask) -> None:
    assert "".join(c.get("text", c.get("delta", {}).get("content", "")) for chunk in events(ask({"stream": True}))
                   for c in chunk["choices"]) == text(ok(ask({})))


def _stream_interval(ask: Ask) -> None:
    fields = {"stream": True, "return_token_ids": True, "ignore_eos": True}
    for interval, sizes_ok in ((None, lambda sizes: sizes == [1] * 8),
                               (3, lambda sizes: sizes[0] == 1 and min(sizes[1:-1]) >= 3 and sum(sizes) == 8)):
        chunks = events(ask({**fields, "stream_interval": interval}))
        sizes = [len(c["token_ids"]) for chunk in chunks for c in chunk["choices"] if c.get("token_ids")]
        assert sizes_ok(sizes), (interval, sizes)
        streamed = "".join(c.get("text", c.get("delta", {}).get("content", "")) for chunk in chunks
                           for c in chunk["choices"])
        assert streamed == text(ok(ask({"ignore_eos": True})))


def _stream_options(ask: Ask) -> None:
    chunks = events(ask({"stream": True, "stream_options": {"include_usage": True}}))
    assert chunks[-1]["usage"]["completion_tokens"] > 0 and not chunks[-1]["choices"]
    assert all(chunk.get("usage") is None for chunk in events(ask({"stream": True})))


def _seed(ask: Ask) -> None:
    sampled = {"temperature": 1.0, "max_tokens": 16}
    one = text(ok(ask({**sampled, "seed": 1})))
    assert one == text(ok(ask({**sampled, "seed": 1}))) != text(ok(ask({**sampled, "seed": 2})))


def _truncated_to_greedy(name: str, value: object) -> Callable[[Ask], None]:
    def probe(ask: Ask) -> None:
        sampled = {"temperature": 1.0, "seed": 3, "max_tokens": 16}
        assert text(ok(ask({**sampled, name: value}))) == text(ok(ask({"max_tokens": 16})))
        assert text(ok(ask(sampled))) != text(ok(ask({"max_tokens": 16})))
    return probe


def _n(ask: Ask) -> None:
    assert len(ok(ask({"n": 2}))["choices"]) == 2


def _request_id(ask: Ask) -> None:
    assert ok(ask({"request_id": "walk-1"}))["id"].endswith("-walk-1")


def _echo(ask: Ask) -> None:
    assert text(ok(ask({"echo": True}))).startswith("Once upon a time")


def _chat_echo(ask: Ask) -> None:
    turn = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Once upon a time"}]
    for fields in ({"messages": turn}, {"messages": HI_ONLY, "add_generation_prompt": False}):
        echoed, plain = ok(ask({**fields, "echo": True})), ok(ask(fields))
        assert text(echoed) == fields["messages"][-1]["content"] + text(plain)
    streamed = events(ask({"messages": turn, "echo": True, "stream": True}))
    assert streamed[0]["choices"][0]["delta"]["content"] == "Once upon a time"
    assert not text(ok(ask({"echo": True}))).startswith("hi")  # the last message is the user's, not the answer's


def _chat_template_kwargs(ask: Ask) -> None:
    changes_prompt_tokens("chat_template_kwargs", {"enable_thinking": False})(ask)
    assert refused(ask({"chat_template_kwargs": {"messages": []}}), "chat_template_kwargs")


def _continue_final_message(ask: Ask) -> None:
    turn = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Once upon"}],
            "add_generation_prompt": False}
    assert ok(ask({**turn, "continue_final_message": True}))["usage"]["prompt_tokens"] < ok(ask(turn))["usage"][
        "prompt_tokens"]  # the template's "\n" after the final message is cut
    assert refused(ask({"continue_final_message": True}), "continue_final_message")  # with add_generation_prompt


def _prompt_logprobs(ask: Ask) -> None:
    body = ok(ask({"prompt_logprobs": 2}))
    shaped = body.get("prompt_logprobs") or body["choices"][0]["prompt_logprobs"]
    assert len(shaped) == body["usage"]["prompt_tokens"] and shaped[0] is None
    for position in shaped[1:]:
        first = next(iter(position.values()))  # the prompt's own token, then the 2 most likely
        assert 1 <= len(position) <= 3 and first["rank"] >= 1 and first["logprob"] <= 0 and "decoded_token" in first
    plain = ok(ask({}))
    assert "prompt_logprobs" not in plain and "prompt_logprobs" not in plain["choices"][0]
    assert refused(ask({"prompt_logprobs": 1, "stream": True}), "prompt_logprobs")


def _completion_logprobs(ask: Ask) -> None:
    assert ok(ask({"logprobs": 1}))["choices"][0]["logprobs"]["top_logprobs"]


def _chat_logprobs(ask: Ask) -> None:
    assert ok(ask({"logprobs": True}))["choices"][0]["logprobs"]["content"]


def _top_logprobs(ask: Ask) -> None:
    content = ok(ask({"logprobs": True, "top_logprobs": 2}))["choices"][0]["logprobs"]["content"]
    assert all(len(position["top_logprobs"]) == 2 for position in content)


def tokens_as_ids(logprobs: dict) -> Callable[[Ask], None]:
    """``return_tokens_as_token_ids``: logprobs name tokens ``token_id:{id}``, not by their text."""
    def probe(ask: Ask) -> None:
        def tokens(fields: dict) -> list[str]:
            choice = ok(ask({**logprobs, **fields}))["choices"][0]["logprobs"]
            return [c["token"] for c in choice["content"]] if "content" in choice else choice["tokens"]
        assert not any(t.startswith("token_id:") for t in tokens({}))
        as_ids = tokens({"return_tokens_as_token_ids": True})
        assert as_ids and all(t.startswith("token_id:") and t[len("token_id:"):].isdigit() for t in as_ids)
    return probe


def _truncate_prompt_tokens(ask: Ask) -> None:
    assert ok(ask({}))["usage"]["prompt_tokens"] > 2
    assert ok(ask({"truncate_prompt_tokens": 2}))["usage"]["prompt_tokens"] == 2


def _truncation_side(ask: Ask) -> None:
    left, right = (ok(ask({"truncate_prompt_tokens": 2, "truncation_side": side})) for side in ("left", "right"))
    assert left["usage"]["prompt_tokens"] == right["usage"]["prompt_tokens"] == 2 and text(left) != text(right)


def _best_of(ask: Ask) -> None:
    sampled = {"temperature": 1.0, "seed": 5, "max_tokens": 16}
    assert ok(ask({**sampled, "best_of": 3}))["usage"]["completion_tokens"] > ok(ask(sampled))["usage"][
        "completion_tokens"]


MOOD = {"type": "object", "properties": {"mood": {"enum": ["happy", "sad"]}, "ok": {"type": "boolean"}},
        "required": ["mood", "ok"], "additionalProperties": False}
YES_NO = ("yes", "no")


def _a_mood(body: dict) -> bool:
    try:
        value = json.loads(text(body))
    except ValueError:
        return False
    return (isinstance(value, dict) and set(value) == {"mood", "ok"} and value["mood"] in ("happy", "sad")
            and isinstance(value["ok"], bool))


def constrains(name: str, value: object, holds: Callable[[dict], bool], bad: object) -> Callable[[Ask], None]:
    """A structured-output field: the answer obeys it (and did not without it); a value that does not compile is
    a 400 naming the field."""
    def probe(ask: Ask) -> None:
        body = ok(ask({name: value, "max_tokens": 64}))
        assert holds(body) and body["choices"][0]["finish_reason"] == "stop", text(body)
        assert not holds(ok(ask({"max_tokens": 64})))
        assert refused(ask({name: bad}), name)
    return probe


def _in_yes_no(body: dict) -> bool:
    return text(body) in YES_NO


def _guided_decoding_backend(ask: Ask) -> None:
    assert text(ok(ask({"guided_choice": list(YES_NO), "guided_decoding_backend": "xgrammar"}))) in YES_NO
    assert refused(ask({"guided_choice": list(YES_NO), "guided_decoding_backend": "outlines"}),
                   "guided_decoding_backend")


STRUCTURED_OUTPUTS: dict[str, Callable[[Ask], None]] = {
    "response_format": constrains("response_format", {"type": "json_schema", "json_schema": {
        "name": "mood", "schema": MOOD, "strict": True}}, _a_mood, {"type": "json_schema", "json_schema": {
            "name": "bad", "schema": {"type": "object", "properties": {"a": {"type": 7}}}}}),
    "structured_outputs": constrains("structured_outputs", {"choice": list(YES_NO)}, _in_yes_no, {"regex": "(yes"}),
    "guided_json": constrains("guided_json", MOOD, _a_mood, {"type": "nothing-real"}),
    "guided_regex": constrains("guided_regex", "(yes|no)", _in_yes_no, "(yes"),
    "guided_choice": constrains("guided_choice", list(YES_NO), _in_yes_no, []),
    "guided_grammar": constrains("guided_grammar", 'root ::= "yes" | "no"', _in_yes_no, 'root ::= "yes" |'),
    "guided_decoding_backend": _guided_decoding_backend,
}
"""Probes of the structured-output fields (the walk's; tests/test_structured_outputs_http.py goes further)."""


COMMON: dict[str, Callable[[Ask], None]] = {
    "model": read_as("model", "no-such-model"),
    "logit_bias": changes_text("logit_bias", {EOS: 100}),
    "max_tokens": limits_tokens("max_tokens"),
    "n": _n,
    "seed": _seed,
    "stop": _stop,
    "stream": _stream,
    "stream_options": _stream_options,
    "stream_interval": _stream_interval,
    "temperature": changes_text("temperature", 1.0, {"seed": 3, "max_tokens": 16}),
    "top_p": _truncated_to_greedy("top_p", 1e-6),
    "top_k": _truncated_to_greedy("top_k", 1),
    "stop_token_ids": _stop_token_ids,
    "include_stop_str_in_output": _include_stop_str_in_output,
    "ignore_eos": _ignore_eos,
    "min_tokens": _min_tokens,
    "skip_special_tokens": _skip_special_tokens,
    "priority": read_as("priority", "high"),
    "request_id": _request_id,
    "return_token_ids": _return_token_ids,
    "cache_salt": read_as("cache_salt", ""),
    "kv_transfer_params": read_as("kv_transfer_params", {"do_remote_decode": "yes"}),
    "prompt_logprobs": _prompt_logprobs,
    "allowed_token_ids": _allowed_token_ids,
    "frequency_penalty": changes_text("frequency_penalty", 2.0, {"max_tokens": 32}),
    "presence_penalty": changes_text("presence_penalty", 2.0, {"max_tokens": 32}),
    "repetition_penalty": changes_text("repetition_penalty", 2.0, {"max_tokens": 32}),
    "min_p": changes_text("min_p", 0.9, {"temperature": 1.5, "seed": 3, "max_tokens": 16}),
    "truncate_prompt_tokens": _truncate_prompt_tokens,
    "truncation_side": _truncation_side,
    **STRUCTURED_OUTPUTS,
}
"""Probes of the fields both endpoints implement."""
COMPLETIONS = COMMON | {
    "prompt": changes_prompt_tokens("prompt", "Once upon a time there was a cat"),
    "echo": _echo,
    "logprobs": _completion_logprobs,
    "best_of": _best_of,
    "add_special_tokens": changes_prompt_tokens("add_special_tokens", False),
    "return_tokens_as_token_ids": tokens_as_ids({"logprobs": 1}),
}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["paris", "rome"]}}, "required": ["city"]}}}
ONE_CALL = {"tools": [TOOL], "parallel_tool_calls": False, "max_tokens": 64}


def called(body: dict) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in body["choices"][0]["message"].get("tool_calls") or []]


def _tools(ask: Ask) -> None:
    assert refused(ask({"tool_choice": "required"}), "tool_choice")  # no tools to call
    [(name, arguments)] = called(ok(ask({**ONE_CALL, "tool_choice": "required"})))
    assert name == "get_weather" and arguments["city"] in ("paris", "rome")


def _tool_choice(ask: Ask) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    [(name, arguments)] = called(ok(ask({**ONE_CALL, "tool_choice": named})))
    assert name == "get_weather" and arguments["city"] in ("paris", "rome")
    assert called(ok(ask({**ONE_CALL, "tool_choice": "none"}))) == []
    auto = ask({**ONE_CALL, "tool_choice": "auto"})  # this server is started without a tool-call parser
    assert refused(auto, "tool_choice") and "--enable-auto-tool-choice" in auto.json()["error"]["message"]


CHAT = COMMON | {
    "tools": _tools,
    "tool_choice": _tool_choice,
    "parallel_tool_calls": read_as("parallel_tool_calls", "no"),
    "include_reasoning": read_as("include_reasoning", "no"),  # its effect: tests/test_reasoning_http.py
    "messages": changes_prompt_tokens("messages", [{"role": "user", "content": "tell me a story"}]),
    "logprobs": _chat_logprobs,
    "top_logprobs": _top_logprobs,
    "max_completion_tokens": limits_tokens("max_completion_tokens"),
    "add_generation_prompt": changes_prompt_tokens("add_generation_prompt", False),
    "add_special_tokens": changes_prompt_tokens("add_special_tokens", True),
    "chat_template": read_as("chat_template", "{{ messages }}"),
    "return_tokens_as_token_ids": tokens_as_ids({"logprobs": True, "top_logprobs": 1}),
    "echo": _chat_echo,
    "chat_template_kwargs": _chat_template_kwargs,
    "documents": changes_prompt_tokens("documents", [{"title": "pets", "text": "a dog and a cat"}]),
    "reasoning_effort": changes_prompt_tokens("reasoning_effort", "low"),
    "continue_final_message": _continue_final_message,
}
