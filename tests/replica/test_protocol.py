"""OpenAI request models: validation, conversion to SamplingParams, error shapes."""

from __future__ import annotations

import pytest
from kvmesh.replica.openai.errors import parse_request
from kvmesh.replica.openai.protocol import ChatCompletionRequest, CompletionRequest
from kvmesh.replica.openai.responses import UsageInfo
from kvmesh.replica.serving.errors import ProtocolError, error_body


def completion(**kw):
    return parse_request(CompletionRequest, {"prompt": "hi", **kw})


def chat(**kw):
    return parse_request(ChatCompletionRequest, {"messages": [{"role": "user", "content": "hi"}], **kw})


def test_error_body_is_openai_shaped():
    body = error_body("nope", 404)
    assert set(body["error"]) >= {"message", "type", "code"}
    assert body["error"]["code"] == 404 and body["error"]["type"] == "not_found_error"


def test_missing_prompt_is_400_naming_the_field():
    with pytest.raises(ProtocolError) as e:
        parse_request(CompletionRequest, {"model": "m"})
    assert e.value.status_code == 400 and "prompt" in e.value.message


def test_body_must_be_an_object():
    with pytest.raises(ProtocolError):
        parse_request(CompletionRequest, ["prompt"])


def test_completion_defaults_to_16_tokens():
    sp = completion().to_sampling_params(prompt_len=3, max_model_len=512)
    assert sp.max_tokens == 16 and sp.temperature == 1.0 and sp.top_k == -1


def test_chat_max_completion_tokens_wins_and_default_fills_context():
    assert chat(max_tokens=5, max_completion_tokens=7).to_sampling_params(3, 512).max_tokens == 7
    assert chat().to_sampling_params(12, 512).max_tokens == 500


def test_sampling_fields_are_carried():
    sp = completion(temperature=0, top_p=0.5, top_k=3, seed=7, stop="x", stop_token_ids=[2], ignore_eos=True)
    sp = sp.to_sampling_params(3, 512)
    assert (sp.temperature, sp.top_p, sp.top_k, sp.seed, sp.stop, sp.stop_token_ids, sp.ignore_eos) == (
        0.0, 0.5, 3, 7, ["x"], [2], True,
    )


@pytest.mark.parametrize(
    "kw, word",
    [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_k": -5}, "top_k"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 1000}, "max_tokens"),
        ({"n": 0}, "n must be"),
        ({"n": 129}, "n must be"),
        ({"logprobs": 21}, "logprobs"),
        ({"logprobs": -1}, "logprobs"),
        ({"n": 2, "best_of": 1}, "best_of"),
        ({"best_of": 3, "stream": True}, "streamed"),
        ({"logit_bias": {"x": 1.0}}, "token ids"),
        ({"logit_bias": {"3": 101}}, "[-100, 100]"),
        ({"cache_salt": ""}, "cache_salt"),
        ({"seed": 2**70}, "seed"),
    ],
)
def test_bad_values_raise_400_saying_what(kw, word):
    with pytest.raises(ProtocolError) as e:
        completion(**kw).to_sampling_params(prompt_len=3, max_model_len=512)
    assert e.value.status_code == 400 and word in e.value.message


def test_prompt_longer_than_context_is_400():
    with pytest.raises(ProtocolError) as e:
        completion().to_sampling_params(prompt_len=600, max_model_len=512)
    assert "600" in e.value.message and "512" in e.value.message


@pytest.mark.parametrize("kw", [{"top_logprobs": 21, "logprobs": True}, {"response_format": {"type": "xml"}}])
def test_chat_features_we_lack_are_refused(kw):
    with pytest.raises(ProtocolError) as e:
        chat(**kw).to_sampling_params(3, 512)
    assert e.value.param == next(iter(kw))


def test_a_tool_without_its_function_is_refused_naming_it():
    with pytest.raises(ProtocolError) as e:
        chat(tools=[{"type": "function"}], tool_choice="none").to_sampling_params(3, 512)
    assert e.value.param == "tools.0.function"


WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "at": {"$ref": "#/$defs/when"}},
    "$defs": {"when": {"type": "string"}}}}}
TIME_TOOL = {"type": "function", "function": {"name": "get_time"}}


def test_required_writes_vllms_schema_into_structured_outputs():
    req = chat(tools=[WEATHER_TOOL, TIME_TOOL], tool_choice="required")
    assert req.to_sampling_params(3, 512).structured_outputs is not None
    assert req.structured_outputs == {"json": {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": [
        {"properties": {"name": {"type": "string", "enum": ["get_weather"]}, "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}, "at": {"$ref": "#/$defs/when"}}}},
         "required": ["name", "parameters"]},
        {"properties": {"name": {"type": "string", "enum": ["get_time"]}, "parameters": {
            "type": "object", "properties": {}}}, "required": ["name", "parameters"]}]},
        "$defs": {"when": {"type": "string"}}}}


def test_a_named_function_writes_its_parameters_as_the_schema():
    req = chat(tools=[WEATHER_TOOL, TIME_TOOL], tool_choice={"type": "function", "function": {"name": "get_weather"}})
    req.to_sampling_params(3, 512)
    assert req.structured_outputs == {"json": WEATHER_TOOL["function"]["parameters"]}


def test_tools_may_not_define_one_def_twice_differently():
    other = {"type": "function", "function": {"name": "other", "parameters": {"$defs": {"when": {"type": "integer"}}}}}
    with pytest.raises(ProtocolError) as e:
        chat(tools=[WEATHER_TOOL, other], tool_choice="required").to_sampling_params(3, 512)
    assert e.value.param == "tools.1.function.parameters"


def test_an_assistant_tool_call_renders_with_its_arguments_as_an_object():
    req = chat(messages=[{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]}])
    assert req.template_messages()[0]["tool_calls"][0]["function"]["arguments"] == {"a": 1}
    bad = chat(messages=[{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}])
    with pytest.raises(ProtocolError) as e:
        bad.template_messages()
    assert e.value.param == "messages.tool_calls.0.function.arguments"


def test_prompts_keeps_a_batch_and_single_prompt_is_its_first():
    assert parse_request(CompletionRequest, {"prompt": ["a"]}).prompts() == ["a"]
    assert parse_request(CompletionRequest, {"prompt": [1, 2]}).prompts() == [[1, 2]]
    assert parse_request(CompletionRequest, {"prompt": [[1, 2], [3]]}).prompts() == [[1, 2], [3]]
    batch = parse_request(CompletionRequest, {"prompt": ["a", "b"]})
    assert batch.prompts() == ["a", "b"] and batch.single_prompt() == "a"  # the router routes by the first
    with pytest.raises(ProtocolError, match="empty"):
        parse_request(CompletionRequest, {"prompt": [[1], []]}).prompts()


def test_logprobs_fields_become_sampling_params():
    sp = completion(logprobs=3, echo=True, logit_bias={"7": -2.5}).to_sampling_params(3, 512)
    assert (sp.logprobs, sp.prompt_logprobs, sp.logit_bias) == (3, 3, {7: -2.5})  # echo: prompt logprobs too
    assert completion(logprobs=0).to_sampling_params(3, 512).prompt_logprobs is None
    sp = chat(logprobs=True, top_logprobs=4).to_sampling_params(3, 512)
    assert (sp.logprobs, sp.prompt_logprobs) == (4, None)
    assert chat(logprobs=True).to_sampling_params(3, 512).logprobs == 0
    assert chat().to_sampling_params(3, 512).logprobs is None


def test_chat_content_parts_join_text():
    req = parse_request(
        ChatCompletionRequest,
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]},
    )
    assert req.template_messages() == [{"role": "user", "content": "a\nb"}]


def test_a_messages_template_form_keeps_reasoning_for_the_assistant_only():
    messages = [{"role": "system", "content": None}, {"role": "user", "content": "q", "reasoning": "not mine"},
                {"role": "assistant", "content": "a", "reasoning_content": "r", "name": "bot"},
                {"role": "tool", "content": "42", "tool_call_id": "c1"}]
    req = parse_request(ChatCompletionRequest, {"messages": messages})
    assert req.template_messages() == [
        {"role": "system", "content": ""}, {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a", "name": "bot", "reasoning": "r", "reasoning_content": "r"},
        {"role": "tool", "content": "42", "tool_call_id": "c1"}]


def test_usage_reports_cached_tokens():
    u = UsageInfo.of(10, 5, 8).model_dump()
    assert u["total_tokens"] == 15 and u["prompt_tokens_details"]["cached_tokens"] == 8


def test_unknown_fields_are_ignored():
    assert completion(frequency_penalty=0, logit_bias={}).prompt == "hi"


def _pydantic_only(model_cls, body):
    """What parse_request answers without its token-id shortcut: pydantic's own validation."""
    try:
        return "ok", model_cls.model_validate(body).model_dump()
    except Exception:
        with pytest.raises(ProtocolError) as e:
            parse_request(type("Plain", (model_cls,), {"__token_id_fields__": ()}), body)
        return "error", e.value.message


@pytest.mark.parametrize("prompt", [
    [1, 2, 3], [0], list(range(5000)), [2**40, 7], [1, True], [True], [1, 2.0], [1, 2.5], [1, "2"], ["a", "b"],
    [1, None], [[1, 2], [3]], [], [-5, 3], [2**70], "text", [1, [2]], [{"a": 1}],
])
def test_token_id_prompts_validate_as_pydantic_does(prompt):
    for model_cls, body in ((CompletionRequest, {"prompt": prompt, "n": 2}),
                            (ChatCompletionRequest, {"messages": [{"role": "user", "content": "hi"}],
                                                     "prompt_token_ids": prompt, "n": 2})):
        want = _pydantic_only(model_cls, body)
        try:
            got = "ok", parse_request(model_cls, body).model_dump()
        except ProtocolError as e:
            got = "error", e.message
        assert got == want, (model_cls.__name__, prompt)


def test_token_id_shortcut_keeps_other_fields_errors():
    with pytest.raises(ProtocolError) as e:
        parse_request(CompletionRequest, {"prompt": [1, 2, 3], "n": "many", "temperature": "hot"})
    assert "n:" in e.value.message and "temperature:" in e.value.message and "prompt" not in e.value.message


def test_tool_call_arguments_nested_past_the_parser_are_a_400_naming_them():
    deep = "[" * 10_000 + "]" * 10_000
    req = chat(messages=[{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": deep}}]}])
    with pytest.raises(ProtocolError, match="nested too deeply") as e:
        req.template_messages()
    assert e.value.param == "messages.tool_calls.0.function.arguments"


@pytest.mark.parametrize("field, items", [("guided_choice", [0] * 100_000), ("stop", [0] * 100_000),
                                          ("logit_bias", {str(i): "x" for i in range(100_000)}),
                                          ("stop_token_ids", ["x"] * 100_000)])
def test_a_huge_list_of_wrong_items_stops_at_the_first(field, items):
    """Pydantic would build one error per item (100,000 errors: ~1 s and ~100 MB to report five); the request models
    stop at the first wrong item of a list or object."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as e:
        CompletionRequest.model_validate({"prompt": "x", field: items})
    assert e.value.error_count() <= 2  # the first wrong item (and, for a union, its other member's error)
    with pytest.raises(ProtocolError, match=field):
        parse_request(CompletionRequest, {"prompt": "x", field: items})


@pytest.mark.parametrize("request_of, kw, asked", [(completion, {"max_tokens": 40}, 40), (completion, {}, 16),
                                                  (chat, {}, 0), (chat, {"max_completion_tokens": 7}, 7)])
def test_a_prompt_that_fills_the_context_is_told_the_max_tokens_it_asked_for(request_of, kw, asked):
    """A completion's max_tokens is 16 unless sent (OpenAI's default); a chat's fills the context, here none."""
    with pytest.raises(ProtocolError) as e:
        request_of(**kw).to_sampling_params(prompt_len=512, max_model_len=512)
    assert f"you requested {asked} output tokens" in e.value.message
    assert e.value.message.endswith("The prompt alone fills the context, leaving no room to generate: shorten it.")


@pytest.mark.parametrize("key", ["5_0", "\u0665", " 5", "5 ", "+5", "0x5", "5.0", ""])
def test_a_logit_bias_key_is_a_token_id_written_in_ascii_digits(key):
    """``int`` would read "5_0" as 50, the Arabic-Indic digit five as 5 and " 5" as 5: a key is digits, as the
    token id is written in JSON's own numbers."""
    with pytest.raises(ProtocolError) as e:
        completion(logit_bias={key: 1}).to_sampling_params(prompt_len=3, max_model_len=512)
    assert e.value.param == "logit_bias" and "logit_bias keys must be token ids" in e.value.message


def test_a_logit_bias_key_of_digits_is_its_token_id():
    assert completion(logit_bias={"5": 1, "017": -2}).to_sampling_params(3, 512).logit_bias == {5: 1, 17: -2}
