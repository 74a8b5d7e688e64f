"""End to end over HTTP against a replica serving stories260K: OpenAI endpoints, usage, prefix cache, events."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import zmq
from kvmesh.events.codec import decode_batch
from kvmesh.events.schema import AllBlocksCleared, BlockStored
from kvmesh.events.wire import END_SEQ, pack_seq, unpack_seq

from .stories_replica import stories_replica

# A prompt of > 4 blocks (16 tokens each) and a continuation sharing all of it.
STORY = ("Once upon a time, there was a little girl named Lily. She loved to play in the park with her "
         "big red ball. One day, she saw a dog in the park and the dog wanted to play with the ball too. "
         "Lily was happy to share, and they played together until the sun went down.")


@pytest.fixture(scope="module")
def replica(stories_path):
    with stories_replica(stories_path, max_num_seqs=128) as runtime:
        yield runtime


@pytest.fixture(scope="module")
def client(replica):
    with httpx.Client(base_url=replica.http.url, timeout=60) as c:
        yield c


def replay(endpoint: str, start_seq: int = 0, timeout_ms: int = 5000) -> list[tuple[int, object]]:
    """Every buffered batch with seq >= start_seq, through the vLLM replay protocol."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, timeout_ms)
    sock.connect(endpoint)
    try:
        sock.send_multipart([b"", pack_seq(start_seq)])
        out = []
        while True:
            frames = sock.recv_multipart()
            if frames[-2] == END_SEQ:
                return out
            out.append((unpack_seq(frames[-2]), decode_batch(frames[-1])))
    finally:
        sock.close()


def test_completion_usage_counts(client, replica):
    r = client.post("/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 7, "temperature": 0,
                                             "ignore_eos": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion" and body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["prompt_tokens"] == len(replica.state.tokenizer.render_completion("Once upon a time")) == 5
    assert body["usage"]["completion_tokens"] == 7 and body["usage"]["total_tokens"] == 12
    assert "cached_tokens" in body["usage"]["prompt_tokens_details"]


def sse_events(text: str) -> list[str]:
    return [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]


def test_streamed_completion_equals_non_streamed(client):
    req = {"prompt": "Lily and Tom", "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    whole = client.post("/v1/completions", json=req).json()["choices"][0]["text"]
    r = client.post("/v1/completions", json={**req, "stream": True, "stream_options": {"include_usage": True}})
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == whole
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 12


def test_chat_non_streamed_and_streamed(client, replica):
    messages = [{"role": "user", "content": "Tell me a story"}]
    req = {"messages": messages, "max_completion_tokens": 6, "temperature": 0, "ignore_eos": True}
    body = client.post("/v1/chat/completions", json=req).json()
    assert body["object"] == "chat.completion" and body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["prompt_tokens"] == len(replica.state.tokenizer.render_chat(messages))
    assert body["usage"]["completion_tokens"] == 6
    events = sse_events(client.post("/v1/chat/completions", json={**req, "stream": True}).text)
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    streamed = "".join(c["choices"][0]["delta"]["content"] or "" for c in chunks)
    assert streamed == body["choices"][0]["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length" and events[-1] == "[DONE]"


def test_shared_prefix_reports_cached_tokens_and_block_stored_events(client, replica):
    tok = replica.state.tokenizer
    prefix = tok.render_completion(STORY)
    assert len(prefix) >= 64
    first = client.post("/v1/completions", json={"prompt": prefix, "max_tokens": 2, "temperature": 0}).json()
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    second = client.post("/v1/completions", json={"prompt": prefix + [300, 301], "max_tokens": 2}).json()
    full_blocks = len(prefix) // 16 * 16
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == full_blocks
    batches = replay(replica.endpoints()["replay_endpoint"])
    assert batches[0][0] == 0 and isinstance(batches[0][1].events[0], AllBlocksCleared)
    stored = [e for _, b in batches for e in b.events if isinstance(e, BlockStored)]
    stored_tokens = {tuple(e.token_ids[i:i + 16]) for e in stored for i in range(0, len(e.token_ids), 16)}
    for i in range(0, full_blocks, 16):
        assert tuple(prefix[i:i + 16]) in stored_tokens


def test_cache_salt_isolates_tenants(client, replica):
    prompt = replica.state.tokenizer.render_completion(STORY + " The end.")
    req = {"prompt": prompt, "max_tokens": 1}
    client.post("/v1/completions", json={**req, "cache_salt": "tenant-a"})
    other = client.post("/v1/completions", json={**req, "cache_salt": "tenant-b"}).json()
    same = client.post("/v1/completions", json={**req, "cache_salt": "tenant-a"}).json()
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert same["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_info_endpoints_for_routers(client, replica):
    assert client.get("/health").status_code == 200
    models = client.get("/v1/models").json()
    assert models["data"][0]["id"] == replica.state.model_name and models["data"][0]["max_model_len"] == 512
    tokens = client.post("/tokenize", json={"prompt": "Once upon a time"}).json()
    assert tokens["tokens"] == [1, 403, 407, 261, 378] and tokens["count"] == 5
    chat_tokens = client.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    assert chat_tokens["tokens"] == replica.state.tokenizer.render_chat([{"role": "user", "content": "hi"}])
    client.post("/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 8, "ignore_eos": True})
    load = client.get("/load").json()
    assert {"num_requests_running", "num_requests_waiting", "kv_cache_usage", "num_waiting_prefill_tokens"} <= set(load)
    # the engine's own measure of its decode steps (replica/engine/step_time.py), for the router's price
    assert load["decode_step"]["num_steps"] > 0 and load["decode_step"]["step_s"] > 0
    assert load["prefill_tokens_per_s"] > 0 and "pull_fixed_s" in load["kv_transfer"]
    for path in ("/server_info", "/get_server_info"):
        assert client.get(path).json()["block_size"] == 16
    for path in ("/model_info", "/get_model_info"):
        assert client.get(path).json()["is_generation"] is True
    metrics = client.get("/metrics").text
    for name in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:kv_cache_usage_perc",
                 "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:num_preemptions_total",
                 "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket"):
        assert name in metrics


@pytest.mark.parametrize(
    "path, body, status, word",
    [
        ("/v1/completions", "{not json", 400, "JSON"),
        ("/v1/completions", json.dumps({"max_tokens": 3}), 400, "prompt"),
        ("/v1/chat/completions", json.dumps({"messages": []}), 400, "messages"),
        ("/v1/completions", json.dumps({"prompt": "hi", "model": "gpt-9"}), 404, "gpt-9"),
        ("/v1/completions", json.dumps({"prompt": "hi " * 600}), 400, "context"),
        ("/v1/completions", json.dumps({"prompt": "hi", "max_tokens": 100000}), 400, "max_tokens"),
        ("/v1/completions", json.dumps({"prompt": "hi", "max_tokens": 0}), 400, "max_tokens"),
        ("/v1/completions", json.dumps({"prompt": "hi", "temperature": -1}), 400, "temperature"),
        ("/v1/completions", json.dumps({"prompt": "hi", "top_p": 1.5}), 400, "top_p"),
        ("/v1/completions", json.dumps({"prompt": "hi", "n": 0}), 400, "n must be"),
        ("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}),
         400, "logprobs: true"),
        ("/v1/completions", json.dumps({"prompt": [1, 99999]}), 400, "token"),
        ("/v1/completions", json.dumps({"prompt": "hi", "priority": 2}), 400, "priority scheduling is not enabled"),
        ("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "x"}], "priority": -1}),
         400, "priority scheduling is not enabled"),
        ("/v1/nothing", "{}", 404, ""),
    ],
)
def test_bad_requests_get_openai_shaped_errors(client, path, body, status, word):
    r = client.post(path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert {"message", "type", "code"} <= set(err) and err["code"] == status
    assert word.lower() in err["message"].lower()


async def test_100_concurrent_streaming_clients_all_complete(replica):
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
    async with httpx.AsyncClient(base_url=replica.http.url, timeout=120, limits=limits) as c:

        async def one(i: int) -> int:
            req = {"prompt": f"Story number {i}:", "max_tokens": 8, "ignore_eos": True, "stream": True,
                   "stream_options": {"include_usage": True}, "seed": i}
            async with c.stream("POST", "/v1/completions", json=req) as r:
                assert r.status_code == 200
                events = [line async for line in r.aiter_lines() if line.startswith("data: ")]
            assert events[-1] == "data: [DONE]"
            return json.loads(events[-2][6:])["usage"]["completion_tokens"]

        results = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(100))), 100)
    assert results == [8] * 100


def test_block_stored_events_arrive_live_on_the_pub_socket(client, replica):
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.RCVTIMEO, 30_000)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(replica.endpoints()["events_endpoint"])
    prompt = list(range(100, 100 + 40))  # 2 full blocks nobody computed before
    try:
        # PUB/SUB joins asynchronously: wait until the publisher's XPUB has seen the subscription.
        assert replica.publisher.wait_for_subscribers(timeout=30), "the subscription never arrived"
        client.post("/v1/completions", json={"prompt": [200] + prompt, "max_tokens": 1})
        topic, seq, payload = sub.recv_multipart()
        events = decode_batch(payload).events
        assert topic == b"" and unpack_seq(seq) > 0  # vLLM's default topic
        assert any(isinstance(e, BlockStored) for e in events)
    finally:
        sub.close()
