"""What the router keeps of a stream to migrate it, and the continuation request it builds (no servers)."""

from __future__ import annotations

import json

import msgspec
import pytest
from kvmesh.replica.openai.body import parse_body
from kvmesh.replica.openai.protocol import ChatCompletionRequest, CompletionRequest
from kvmesh.router.http.migration import MigratingStream
from kvmesh.router.http.proxy_request import ProxyRequest
from kvmesh.router.http.sse_events import SseSplitter
from kvmesh.router.http.token_forwarding import KVMESH, TEXT


def chunk(text: str, ids: list[int] | None, finish: str | None = None, prompt_ids: list[int] | None = None) -> bytes:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    if ids is not None:
        choice["token_ids"] = ids
    body = {"id": "cmpl-1", "object": "text_completion", "created": 7, "model": "m", "choices": [choice],
            "usage": None}
    if prompt_ids is not None:
        body["prompt_token_ids"] = prompt_ids
    return b"data: " + json.dumps(body, separators=(",", ":")).encode()


def completion(**fields) -> CompletionRequest:
    return CompletionRequest(prompt=[1, 2, 3], stream=True, **fields)


@pytest.mark.parametrize("kind", [KVMESH, TEXT])
def test_token_id_request_wins_over_the_clients_own_false(kind):
    raw = json.dumps({"prompt": "hi", "stream": True, "return_token_ids": False, "unknown_field": [1]}).encode()
    request = ProxyRequest(msgspec.json.decode(raw), parse_body(raw, CompletionRequest), [[1, 2]], False, True)
    request.ask_for_token_ids()
    sent = request.for_kind(kind)
    req = parse_body(sent, CompletionRequest)
    assert req.return_token_ids is True and sent.count(b'"return_token_ids"') == 1
    assert req.prompt == ([1, 2] if kind == KVMESH else "hi") and json.loads(sent)["unknown_field"] == [1]


def test_sse_splitter_reassembles_events_cut_anywhere():
    data = chunk("a", [5]) + b"\n\n" + chunk("b", [6]) + b"\n\ndata: [DONE]\n\n"
    split = SseSplitter()
    events = [e for i in range(0, len(data), 7) for e in split.feed(data[i:i + 7])]
    assert events == [chunk("a", [5]), chunk("b", [6]), b"data: [DONE]"]


def test_relay_keeps_token_ids_and_cuts_them_out_for_the_client():
    s = MigratingStream(completion(), chat=False, prompt_ids=[1, 2, 3], tokenizer=None, limit=3)
    out = s.relay(chunk("Once", [10, 11], prompt_ids=[1, 2, 3]))
    assert s.output_ids == [10, 11] and s.id == "cmpl-1" and s.created == 7
    sent = msgspec.json.decode(out.strip()[6:])
    assert "token_ids" not in sent["choices"][0] and "prompt_token_ids" not in sent
    assert sent["choices"][0]["text"] == "Once"


def test_relay_passes_token_ids_to_a_client_that_asked():
    s = MigratingStream(completion(return_token_ids=True), chat=False, prompt_ids=[1, 2, 3], tokenizer=None, limit=3)
    assert msgspec.json.decode(s.relay(chunk("a", [4])).strip()[6:])["choices"][0]["token_ids"] == [4]


def test_an_abort_or_error_is_held_back_and_marks_the_upstream_broken():
    s = MigratingStream(completion(), chat=False, prompt_ids=[1, 2, 3], tokenizer=None, limit=3)
    assert s.relay(chunk("", [], finish="abort")) is None and "aborted" in s.broken
    s.broken = None
    assert s.relay(b'data: {"error": {"message": "boom", "code": 500}}') is None and "boom" in s.broken
    assert not s.done


def test_an_upstream_without_token_ids_cannot_migrate():
    s = MigratingStream(completion(), chat=False, prompt_ids=[1, 2, 3], tokenizer=None, limit=3)
    s.relay(chunk("text", None))
    assert not s.can_migrate()


def test_a_chat_whose_replica_reads_its_reasoning_cannot_migrate():
    req = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], stream=True)
    assert MigratingStream(req, chat=True, prompt_ids=[1, 2, 3], tokenizer=None, limit=3).can_migrate()
    assert not MigratingStream(req, chat=True, prompt_ids=[1, 2, 3], tokenizer=None, limit=3,
                               reads_reasoning=True).can_migrate()
    # a completion's text is never read for reasoning
    assert MigratingStream(completion(), chat=False, prompt_ids=[1, 2, 3], tokenizer=None, limit=3,
                           reads_reasoning=True).can_migrate()


def test_no_prompt_ids_are_learned_from_the_first_chunk():
    s = MigratingStream(completion(), chat=False, prompt_ids=[], tokenizer=None, limit=3)
    s.relay(chunk("a", [9], prompt_ids=[1, 2, 3]))
    assert s.prompt_ids == [1, 2, 3] and s.can_migrate()


def test_continuation_is_prompt_plus_output_with_the_budget_reduced():
    req = completion(max_tokens=10, min_tokens=4, temperature=0.7, top_p=0.9, top_k=5, seed=42, stop=["END"],
                     stop_token_ids=[2], ignore_eos=True, cache_salt="tenant")
    s = MigratingStream(req, chat=False, prompt_ids=[1, 2, 3], tokenizer=None, limit=3)
    s.relay(chunk("a", [7, 8]))
    s.relay(chunk("b", [9]))
    body = s.continuation()
    assert body["prompt"] == [1, 2, 3, 7, 8, 9]
    assert body["max_tokens"] == 7 and body["min_tokens"] == 1
    assert body["seed"] == req.continuation_seed(3) != 42
    assert (body["temperature"], body["top_p"], body["top_k"]) == (0.7, 0.9, 5)
    assert body["stop"] == ["END"]  # no tokenizer in the router: the new replica finds stop strings
    assert body["stop_token_ids"] == [2] and body["ignore_eos"] and body["cache_salt"] == "tenant"
    assert body["stream"] and body["return_token_ids"]
    CompletionRequest(**body).to_sampling_params(6, 100)  # a valid request for the replica


def test_nothing_left_to_generate_means_no_continuation():
    s = MigratingStream(completion(max_tokens=2), chat=False, prompt_ids=[1, 2, 3], tokenizer=None, limit=3)
    s.relay(chunk("ab", [7, 8]))
    assert s.continuation() is None
    ending = s.finish("length")
    assert ending[-1] == b"data: [DONE]\n\n" and s.done
    assert msgspec.json.decode(ending[0].strip()[6:])["choices"][0]["finish_reason"] == "length"


def test_spliced_chunks_keep_the_streams_id_and_shape_and_end_with_one_usage():
    req = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], stream=True,
                                  stream_options={"include_usage": True})
    s = MigratingStream(req, chat=True, prompt_ids=[1, 2, 3], tokenizer=None, limit=3)
    role = b'data: {"id":"chatcmpl-9","object":"chat.completion.chunk","created":5,"model":"m",' \
           b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},"token_ids":[]}]}'
    s.relay(role)
    s.begin_continuation()
    out = s.splice(chunk(" there", [12]))
    out += s.splice(b'data: {"id":"cmpl-x","choices":[{"index":0,"text":"!","finish_reason":"length",'
                    b'"token_ids":[13]}],"usage":{"prompt_tokens":5,"completion_tokens":2,'
                    b'"prompt_tokens_details":{"cached_tokens":4}}}')
    events = [e.strip()[6:] for e in out]
    assert events[-1] == b"[DONE]"
    chunks = [msgspec.json.decode(e) for e in events[:-1]]
    assert {c["id"] for c in chunks} == {"chatcmpl-9"} and {c["created"] for c in chunks} == {5}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert [c["choices"][0]["delta"]["content"] for c in chunks if c["choices"]] == [" there", "!"]
    usage = [c["usage"] for c in chunks if c.get("usage")]
    assert usage == [{"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
                      "prompt_tokens_details": {"cached_tokens": 3}}]


@pytest.mark.parametrize("limit", [0, 1])
def test_the_migration_limit_bounds_the_moves(limit):
    s = MigratingStream(completion(), chat=False, prompt_ids=[1, 2, 3], tokenizer=None, limit=limit)
    for _ in range(limit):
        assert s.can_migrate()
        s.begin_continuation()
    assert not s.can_migrate()


def test_prompt_ids_in_the_choice_as_vllm_sends_them_for_completions():
    s = MigratingStream(completion(), chat=False, prompt_ids=[], tokenizer=None, limit=3)
    event = (b'data: {"id":"cmpl-2","created":1,"model":"m","choices":[{"index":0,"text":"a",'
             b'"finish_reason":null,"prompt_token_ids":[4,5],"token_ids":[6]}]}')
    sent = msgspec.json.decode(s.relay(event).strip()[6:])
    assert s.prompt_ids == [4, 5] and s.output_ids == [6]
    assert sent["choices"][0] == {"index": 0, "text": "a", "finish_reason": None}


def test_continuation_keeps_the_output_text_rules_and_the_logit_bias():
    req = completion(skip_special_tokens=False, include_stop_str_in_output=True, logit_bias={"7": -100})
    body = MigratingStream(req, chat=False, prompt_ids=[1, 2, 3], tokenizer=None, limit=3).continuation()
    assert body["skip_special_tokens"] is False and body["include_stop_str_in_output"] is True
    assert body["logit_bias"] == {"7": -100}


@pytest.mark.parametrize("keep", [False, True])
def test_a_continuations_stop_token_text_is_output_only_when_asked(stories_path, keep):
    from kvmesh.replica.serving.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(stories_path)
    prompt, (a, b) = tokenizer.encode("Once upon a time"), tokenizer.encode("there was", add_special_tokens=False)[:2]
    s = MigratingStream(completion(include_stop_str_in_output=keep), chat=False, prompt_ids=prompt,
                        tokenizer=tokenizer, limit=3)
    s.begin_continuation()
    out = s.splice(chunk("ignored", [a, b], finish="stop"))
    texts = [msgspec.json.decode(e.strip()[6:])["choices"][0]["text"] for e in out if e.strip() != b"data: [DONE]"]
    shown = [a, b] if keep else [a]
    assert "".join(texts) == tokenizer.decode(prompt + shown)[len(tokenizer.decode(prompt)):]


def test_a_chat_stream_begun_on_the_continuation_starts_with_its_echo():
    turn = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Once"}]
    req = ChatCompletionRequest(messages=turn, stream=True, echo=True)
    s = MigratingStream(req, chat=True, prompt_ids=[1, 2, 3], tokenizer=None, limit=3)
    first = msgspec.json.decode(s.begin_continuation()[0].strip()[6:])
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": "Once"}


def test_a_continuation_resumes_the_structured_output_after_the_tokens_sent():
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}}
    req = completion(max_tokens=10,
                     response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    s = MigratingStream(req, chat=False, prompt_ids=[1, 2, 3], tokenizer=None, limit=3)
    s.relay(chunk("{", [7, 8]))
    body = s.continuation()
    assert body["structured_outputs"] == {"json": schema, "num_resumed_tokens": 2}
    resumed = CompletionRequest(**body).to_sampling_params(5, 100).structured_outputs
    assert resumed.num_resumed_tokens == 2 and resumed.key == req.structured_outputs_params().key


def test_a_chat_whose_text_becomes_tool_calls_is_not_continued_as_text():
    tools = [{"type": "function", "function": {"name": "f"}}]
    for choice, migrates in (("required", False), ("none", True)):
        req = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], tools=tools, tool_choice=choice)
        assert MigratingStream(req, chat=True, prompt_ids=[1, 2], tokenizer=None, limit=3).can_migrate() is migrates


CHANGED_ON_PURPOSE = {"max_tokens", "min_tokens", "seed", "structured_outputs", "stop", "prompt_logprobs"}
"""What a continuation sets anew: the budget left, the seed moved on, the constraint resumed, stop strings (the
router finds them), prompt logprobs (of the user's prompt only: not streamable, so never migrated)."""


@pytest.mark.parametrize("chat", [False, True])
def test_a_continuation_samples_with_every_sampling_parameter_of_the_stream(chat):
    """Each field of the engine's SamplingParams is the stream's own in its continuation (a new field fails this
    test until migration carries it)."""
    from dataclasses import fields

    from kvmesh.replica.serving.sampling_params import SamplingParams

    common = dict(stream=True, max_tokens=20, temperature=0.5, top_p=0.8, top_k=7, seed=3, stop_token_ids=[2],
                  ignore_eos=True, skip_special_tokens=False, include_stop_str_in_output=True,
                  allowed_token_ids=[5, 6, 7, 8, 9], logit_bias={"5": 1.5}, presence_penalty=0.5,
                  frequency_penalty=0.25, repetition_penalty=1.2, min_p=0.05, return_tokens_as_token_ids=True)
    if chat:
        req = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], logprobs=True, top_logprobs=3,
                                      **common)
    else:
        req = CompletionRequest(prompt=[1, 2, 3], logprobs=3, **common)
    s = MigratingStream(req, chat=chat, prompt_ids=[1, 2, 3], tokenizer=None, limit=3)
    s.relay(chunk("a", [7, 8]))
    body = s.continuation()
    assert body["return_tokens_as_token_ids"] is True
    original = req.to_sampling_params(3, 100)
    resumed = CompletionRequest(**body).to_sampling_params(5, 100)
    for name in {f.name for f in fields(SamplingParams)} - CHANGED_ON_PURPOSE:
        assert getattr(resumed, name) == getattr(original, name), name


def _with_logprobs(event: bytes, logprobs: dict) -> bytes:
    body = json.loads(event[6:])
    body["choices"][0]["logprobs"] = logprobs
    return b"data: " + json.dumps(body).encode()


def test_a_continuations_logprobs_go_on_in_a_completion_streams_shape():
    s = MigratingStream(completion(logprobs=1), chat=False, prompt_ids=[1, 2, 3], tokenizer=None, limit=3)
    s.relay(_with_logprobs(chunk("ab", [7, 8]), {"tokens": ["a", "b"], "token_logprobs": [-0.1, -0.2],
                                                  "top_logprobs": [{"a": -0.1}, {"b": -0.2}], "text_offset": [0, 1]}))
    s.begin_continuation()
    out = s.splice(_with_logprobs(chunk("cd", [9, 10]), {
        "tokens": ["c", "d"], "token_logprobs": [-0.5, -0.7], "top_logprobs": [{"c": -0.5, "x": -1.0}, {"d": -0.7}],
        "text_offset": [0, 1]}))
    logprobs = msgspec.json.decode(out[0].strip()[6:])["choices"][0]["logprobs"]
    assert logprobs == {"tokens": ["c", "d"], "token_logprobs": [-0.5, -0.7],
                        "top_logprobs": [{"c": -0.5, "x": -1.0}, {"d": -0.7}], "text_offset": [2, 3]}


def test_a_continuations_logprobs_become_a_chat_streams_content_with_its_top_logprobs():
    req = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], stream=True, logprobs=True,
                                  top_logprobs=1)
    s = MigratingStream(req, chat=True, prompt_ids=[1, 2, 3], tokenizer=None, limit=3)
    assert s.continuation()["logprobs"] == 1
    s.begin_continuation()
    out = s.splice(_with_logprobs(chunk("é", [9]), {"tokens": ["é"], "token_logprobs": [-0.5],
                                                    "top_logprobs": [{"é": -0.5, "e": -1.5}], "text_offset": [0]}))
    logprobs = msgspec.json.decode(out[-1].strip()[6:])["choices"][0]["logprobs"]
    assert logprobs == {"content": [{"token": "é", "logprob": -0.5, "bytes": [195, 169],
                                     "top_logprobs": [{"token": "é", "logprob": -0.5, "bytes": [195, 169]}]}]}
