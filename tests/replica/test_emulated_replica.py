"""An emulated replica is the real one with no model: its events equal a real stories260K replica's for the same
tokens, and its HTTP answers honour max_tokens, stop, streaming and usage as a model's would."""

from __future__ import annotations

import functools
import json

import httpx
import pytest
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.emulate.config import EmulationConfig
from kvmesh.replica.engine.llm_engine import LLMEngine

from .stories_replica import stories_replica
from .test_emulated_runner import generate, stored
from .test_engine_events import RecordingPublisher

EMULATED = {"emulation": EmulationConfig(emulate="h100-8b"), "kv_cache_memory": "256MiB", "max_model_len": 4096}


def test_an_emulated_replica_publishes_the_events_a_real_one_does(stories_path):
    prompt = [1] + list(range(40, 40 + 76))  # 77 tokens: 4 full blocks of 16 and a partial one
    events = []
    for engine_kwargs in ({"kv_cache_memory": 4 << 20}, EMULATED):
        publisher = RecordingPublisher()
        config = EngineConfig(model=str(stories_path), hash_seed=b"seed", **engine_kwargs)
        engine = LLMEngine(config, event_publisher=publisher)
        generate(engine, {"a": prompt}, max_tokens=1)
        generate(engine, {"b": prompt[:40] + [7] * 30}, max_tokens=1)  # a shared prefix, then its own blocks
        events.append(stored(publisher.batches))
    real, emulated = events
    assert emulated == real
    assert sum(len(e.block_hashes) for e in real) == 4 + 2


@pytest.fixture(scope="module")
def replica(stories_path):
    with stories_replica(stories_path, **EMULATED) as runtime:
        yield runtime.http.url


def complete(url: str, **body) -> dict:
    r = httpx.post(f"{url}/v1/completions", json={"model": model(url), "prompt": "Once upon a time", **body},
                   timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


@functools.cache
def model(url: str) -> str:
    return httpx.get(f"{url}/v1/models").json()["data"][0]["id"]


def test_max_tokens_and_usage(replica):
    answer = complete(replica, max_tokens=9)
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == 9
    assert answer["usage"]["prompt_tokens"] == answer["usage"]["total_tokens"] - 9


def test_a_stop_string_ends_the_text_where_it_first_appears(replica):
    text = complete(replica, max_tokens=40)["choices"][0]["text"]
    stop = next(text[i:i + 2] for i in range(4, len(text) - 1) if text[i:i + 2].isalnum())
    answer = complete(replica, max_tokens=40, stop=[stop])
    assert answer["choices"][0]["finish_reason"] == "stop"
    assert answer["choices"][0]["text"] == text[:text.index(stop)]


def test_a_stream_says_what_the_whole_answer_says(replica):
    whole = complete(replica, max_tokens=12)
    chunks = []
    with httpx.stream("POST", f"{replica}/v1/completions", timeout=30, json={
            "model": model(replica), "prompt": "Once upon a time", "max_tokens": 12, "stream": True,
            "stream_options": {"include_usage": True}}) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == whole["choices"][0]["text"]
    assert chunks[-1]["usage"]["completion_tokens"] == 12


def test_every_token_is_text_at_once_so_the_first_chunk_is_the_first_token(replica):
    """A model writes text: each token streams as a chunk of its own. Random ids would include byte pieces that the
    detokenizer holds until the next tokens complete a character, so a client's TTFT would wait for later steps."""
    chunks = []
    with httpx.stream("POST", f"{replica}/v1/completions", timeout=30, json={
            "model": model(replica), "prompt": "Once upon a time", "max_tokens": 24, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks += [c["text"] for c in json.loads(line[6:])["choices"]]
    assert len(chunks) == 24 and all(chunks), chunks
    assert "\ufffd" not in "".join(chunks)


def test_load_and_metrics_say_what_the_peers_scrape(replica):
    complete(replica, max_tokens=4)
    load = httpx.get(f"{replica}/load").json()
    assert load["emulation"]["profile"] == "h100-8b" and load["emulation"]["num_steps"] >= 4
    assert 0 <= load["emulation"]["late_s_p50"] <= load["emulation"]["late_s_p99"] < 1.0  # a busy machine adds some
    metrics = httpx.get(f"{replica}/metrics").text
    for name in ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                 "vllm:cache_config_info"):
        assert f"\n{name}{{" in metrics
