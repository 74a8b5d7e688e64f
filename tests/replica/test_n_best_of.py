"""n > 1, best_of and lists of prompts over HTTP: choices indexed as vLLM does, sharing the prompt's KV blocks."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from .stories_replica import stories_replica

# > 3 full 16-token blocks, so sibling choices can find the prompt in the prefix cache.
STORY = ("Once upon a time, there was a little girl named Lily. She loved to play in the park with her "
         "big red ball. One day, she saw a dog in the park.")
OTHER = "Tom and Sue went to the beach. They built a big sand castle and"


@pytest.fixture(scope="module")
def replica(stories_path):
    with stories_replica(stories_path, max_num_seqs=32) as runtime:
        yield runtime


@pytest.fixture(scope="module")
def client(replica):
    with httpx.Client(base_url=replica.http.url, timeout=60) as c:
        yield c


def post(client, path="/v1/completions", **body) -> dict:
    r = client.post(path, json={"max_tokens": 6, "ignore_eos": True, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_n_greedy_choices_equal_the_single_choice(client):
    single = post(client, prompt=STORY, temperature=0)["choices"][0]["text"]
    body = post(client, prompt=STORY, temperature=0, n=3)
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert [c["text"] for c in body["choices"]] == [single] * 3
    assert body["usage"]["completion_tokens"] == 18


def test_n_choices_share_the_prompt_blocks_through_the_prefix_cache(client, replica):
    story = "The sun was hot that day. " + STORY  # its first block is not cached by another test
    prompt_tokens = len(replica.state.tokenizer.render_completion(story))
    full_block_tokens = (prompt_tokens - 1) // 16 * 16  # what a sibling can reuse (the last token is recomputed)
    hits_before = replica.llm.get_stats().prefix_cache_hits
    body = post(client, prompt=story, temperature=1.0, seed=3, n=4)
    assert body["usage"]["prompt_tokens"] == prompt_tokens  # the prompt is counted once, as vLLM does
    assert replica.llm.get_stats().prefix_cache_hits - hits_before == 3 * full_block_tokens


def test_seeded_n_choices_differ_and_repeat(client):
    first = post(client, prompt=STORY, temperature=1.5, seed=11, n=4)
    again = post(client, prompt=STORY, temperature=1.5, seed=11, n=4)
    texts = [c["text"] for c in first["choices"]]
    assert texts == [c["text"] for c in again["choices"]]
    assert len(set(texts)) > 1  # child i samples with seed + i (vLLM's rule), not all the same draw


def test_list_of_prompts_numbers_choices_prompt_by_prompt(client):
    alone = [post(client, prompt=p, temperature=0)["choices"][0]["text"] for p in (STORY, OTHER)]
    body = post(client, prompt=[STORY, OTHER], temperature=0, n=2)
    by_index = {c["index"]: c["text"] for c in body["choices"]}
    assert by_index == {0: alone[0], 1: alone[0], 2: alone[1], 3: alone[1]}  # index = prompt * n + choice


def test_list_of_token_id_prompts_with_echo_and_logprobs(client, replica):
    ids = [replica.state.tokenizer.render_completion(p) for p in (STORY, OTHER)]
    body = post(client, prompt=ids, temperature=0, max_tokens=1, echo=True, logprobs=1)
    for choice, prompt in zip(sorted(body["choices"], key=lambda c: c["index"]), ids, strict=True):
        lp = choice["logprobs"]
        assert len(lp["token_logprobs"]) == len(prompt) + 1 and lp["token_logprobs"][0] is None
        assert all(v is not None for v in lp["token_logprobs"][1:])


def test_best_of_returns_the_candidates_with_the_highest_cumulative_logprob(client):
    req = {"prompt": STORY, "temperature": 1.5, "seed": 5, "logprobs": 0}
    all_four = post(client, **req, n=4)["choices"]  # the same candidates best_of=4 samples (seed + i)
    best = post(client, **req, n=2, best_of=4)["choices"]

    def score(choice: dict) -> float:
        return sum(choice["logprobs"]["token_logprobs"])

    expected = sorted(all_four, key=score, reverse=True)[:2]
    assert [c["text"] for c in best] == [c["text"] for c in expected]
    assert [c["index"] for c in best] == [0, 1]


def test_best_of_without_logprobs_returns_none(client):
    body = post(client, prompt=STORY, temperature=1.0, best_of=3)
    assert len(body["choices"]) == 1 and body["choices"][0]["logprobs"] is None
    assert body["usage"]["completion_tokens"] == 18  # every candidate's tokens were generated


def test_streamed_n_choices_carry_their_index(client):
    r = client.post("/v1/completions", json={"prompt": [STORY, OTHER], "n": 2, "temperature": 0, "max_tokens": 4,
                                             "ignore_eos": True, "stream": True,
                                             "stream_options": {"include_usage": True}})
    events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    texts: dict[int, str] = {}
    for c in chunks:
        for choice in c["choices"]:
            texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
    whole = post(client, prompt=[STORY, OTHER], n=2, temperature=0, max_tokens=4)
    assert texts == {c["index"]: c["text"] for c in whole["choices"]}
    assert chunks[-1]["usage"]["completion_tokens"] == 16


def test_chat_n_choices(client):
    body = post(client, "/v1/chat/completions", messages=[{"role": "user", "content": "Hi"}], n=2, temperature=0)
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert body["choices"][0]["message"] == body["choices"][1]["message"]


def wait_idle(replica, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    manager = replica.llm.engine.kv_cache_manager
    while time.monotonic() < deadline:
        if replica.llm.num_unfinished() == 0 and manager.usage == 0.0:
            return
        time.sleep(0.05)
    raise AssertionError(f"still busy: {replica.llm.num_unfinished()} requests, usage {manager.usage}")


def aborted(replica) -> int:
    return replica.llm.get_stats().num_finished.get("abort", 0)


def test_disconnect_mid_stream_aborts_every_choice(client, replica):
    before = aborted(replica)
    body = {"prompt": [STORY, OTHER], "n": 2, "stream": True, "max_tokens": 400, "ignore_eos": True}
    with client.stream("POST", "/v1/completions", json=body) as r:
        lines = r.iter_lines()
        assert any(next(lines).startswith("data: ") for _ in range(6))
    wait_idle(replica)
    assert aborted(replica) == before + 4


def test_disconnect_while_waiting_for_all_choices_aborts_them(replica):
    before = aborted(replica)
    body = json.dumps({"prompt": STORY, "n": 3, "max_tokens": 400, "ignore_eos": True}).encode()
    with socket.create_connection((replica.http.host, replica.http.port)) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        deadline = time.monotonic() + 10
        while replica.llm.num_unfinished() < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    wait_idle(replica)
    assert aborted(replica) == before + 3
