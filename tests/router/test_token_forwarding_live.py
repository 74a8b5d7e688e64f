"""Tokenize once, live: a stories260K replica answers the same whether the router forwards its token ids or not.

One real replica behind two routers (``forward_token_ids`` on and off). The same completions and chat
bodies (greedy and seeded, streamed and not) sent directly, through the router that forwards ids and
through the one that does not give the same text and the same usage; the replica's tokenizer (its
``encode`` and chat template) is not called for a forwarded request.
"""

from __future__ import annotations

import json

import httpx
import pytest
from kvmesh.router.config import ReplicaSpec, RouterConfig, TokenizeConfig, UpstreamConfig
from kvmesh.router.control.router_server import RouterServer
from kvmesh.router.http.token_forwarding import KVMESH

from .conftest import wait_for

pytestmark = pytest.mark.slow

STORY = ("Once upon a time, there was a little girl named Lily. She loved to play in the park with her "
         "big red ball. One day, she saw a dog in the park and the dog wanted to play with the ball too.")


class Counting:
    """Wraps one tokenizer method and counts its calls."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.fn(*args, **kwargs)


@pytest.fixture(scope="module")
def setup(stories_path):
    from kvmesh.replica.config import EngineConfig
    from kvmesh.replica.openai.config import FrontendConfig
    from kvmesh.replica.runtime import ReplicaRuntime
    from kvmesh.replica.server.config import ReplicaServerConfig
    from kvmesh.replica.serving.tokenizer import load_tokenizer

    from ..conftest import CHAT_TEMPLATE

    rt = ReplicaRuntime.start(EngineConfig(model=str(stories_path), kv_cache_memory=4 << 20, max_num_seqs=16),
                              ReplicaServerConfig(port=0, event_port=0, replay_port=0),
                              frontend=FrontendConfig(chat_template=CHAT_TEMPLATE))
    tok = rt.state.tokenizer
    counters = {name: Counting(getattr(tok, name)) for name in ("encode", "apply_chat_template", "render_completion")}
    for name, counter in counters.items():
        setattr(tok, name, counter)
    spec = ReplicaSpec(rt.http.url, rt.endpoints()["events_endpoint"], rt.endpoints()["replay_endpoint"],
                       replica_id="r0")
    routers = {}
    try:
        for on in (True, False):
            router_tok = load_tokenizer(stories_path, chat_template=CHAT_TEMPLATE)
            routers[on] = RouterServer(RouterConfig(port=0, block_size=16,
                                                    upstream=UpstreamConfig(poll_interval_s=0.2),
                                                    tokenize=TokenizeConfig(forward_token_ids=on)),
                                       [spec], tokenizer=router_tok).start()
            wait_for(lambda r=routers[on]: r.runtime.router.healthy, what="the replica healthy")
        yield rt, routers, counters
    finally:
        for router in routers.values():
            router.stop()
        rt.shutdown(graceful_s=0.5)


def tokenizer_calls(counters) -> int:
    return counters["encode"].calls + counters["apply_chat_template"].calls


def answer(url: str, path: str, body: dict) -> tuple[list[str], dict]:
    """The choices' texts (streams joined, ordered by index) and the usage."""
    r = httpx.post(url + path, json=body, timeout=60)
    assert r.status_code == 200, r.text
    if not body.get("stream"):
        out = r.json()
        return [c["text"] if "text" in c else c["message"]["content"] for c in out["choices"]], out["usage"]
    texts: dict[int, str] = {}
    usage = None
    for line in r.text.splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        assert "error" not in chunk, chunk
        assert "token_ids" not in json.dumps(chunk["choices"]), "the router's token ids reached the client"
        for c in chunk["choices"]:
            texts[c["index"]] = texts.get(c["index"], "") + (c.get("text") or c.get("delta", {}).get("content") or "")
        usage = chunk.get("usage") or usage
    return [texts[i] for i in sorted(texts)], usage


GREEDY = {"max_tokens": 12, "temperature": 0}
SEEDED = {"max_tokens": 12, "temperature": 0.9, "seed": 1234}
CHAT = [{"role": "system", "content": "Tell stories."}, {"role": "user", "content": STORY}]
CASES = [
    ("/v1/completions", {"prompt": STORY, **GREEDY}),
    ("/v1/completions", {"prompt": STORY, **SEEDED, "cache_salt": "tenant-a"}),
    ("/v1/completions", {"prompt": [STORY, STORY + " The end."], **SEEDED, "n": 2}),
    ("/v1/chat/completions", {"messages": CHAT, **GREEDY}),
    ("/v1/chat/completions", {"messages": CHAT, **SEEDED, "cache_salt": "tenant-b"}),
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path, body", CASES)
def test_forwarded_ids_give_the_same_answer_without_tokenizing_on_the_replica(setup, path, body, stream):
    rt, routers, counters = setup
    assert routers[True].runtime.replicas.get("r0").accepts == KVMESH
    body = {**body, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    answer(rt.http.url, path, body)  # warm the cache: every answer below sees the same cached prefix
    direct = answer(rt.http.url, path, body)
    before = tokenizer_calls(counters)
    forwarded = answer(routers[True].url, path, body)
    assert tokenizer_calls(counters) == before, "the replica tokenized a request whose ids the router forwarded"
    plain = answer(routers[False].url, path, body)
    assert tokenizer_calls(counters) > before, "with forwarding off the replica tokenizes (the counter works)"
    assert forwarded == direct == plain
    assert forwarded[1]["prompt_tokens"] > 16
    assert forwarded[1]["prompt_tokens_details"]["cached_tokens"] > 0


def test_echo_keeps_the_clients_text_and_is_not_rewritten(setup):
    rt, routers, counters = setup
    body = {"prompt": STORY, "echo": True, **GREEDY}
    direct = answer(rt.http.url, "/v1/completions", body)
    before = tokenizer_calls(counters)
    forwarded = answer(routers[True].url, "/v1/completions", body)
    assert tokenizer_calls(counters) > before  # echo: the replica gets the client's text, as sent
    assert forwarded[0] == direct[0] and forwarded[0][0].startswith(STORY)


def test_chat_prompt_token_ids_sent_directly_are_range_checked(setup):
    rt, routers, _ = setup
    vocab = rt.state.tokenizer.vocab_size
    for ids, why in (([1, vocab + 5], "out of range"), ([], "prompt_token_ids is empty"), ([1] * 600, "context")):
        r = httpx.post(rt.http.url + "/v1/chat/completions", timeout=30,
                       json={"messages": CHAT, "prompt_token_ids": ids, "max_tokens": 2})
        assert r.status_code == 400 and why in r.json()["error"]["message"]
        # the router sets a chat's ids itself (router/http/router_only.py): a client's are refused, whatever they are
        r = httpx.post(routers[True].url + "/v1/chat/completions", timeout=30,
                       json={"messages": CHAT, "prompt_token_ids": ids, "max_tokens": 2})
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt_token_ids"
