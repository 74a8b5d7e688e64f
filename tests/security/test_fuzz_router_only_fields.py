"""The router decides on the DECODED body; no spelling of a router-only field gets past it.

``kv_transfer_params`` (and a chat's ``prompt_token_ids``) mean what the JSON decodes to, whatever the bytes:
unicode escapes of any of its characters (either hex case), whitespace, duplicate keys in either order with a
null or an evil value, nested evil objects whose own keys are escaped. Hypothesis writes the spellings; a
real router sends them to fake replicas (cluster/measure/benchmarks/support/fake_replica.py records every
``kv_transfer_params`` it decodes, and calls ``remote_url`` as a replica does) with KV transfer off, so the
router itself never sets the field: whatever a replica got came from the client. The property: the router
refuses (an OpenAI-shaped 4xx) or the replica got nothing to act on, and nothing called the listener. A few
spellings then go through the live cluster, where the replicas' lease and pull counters must not move.
"""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kvmesh.router.config import RouterConfig, UpstreamConfig
from kvmesh.router.control.router_server import RouterServer

from ..conftest import CHAT_TEMPLATE
from ..router.conftest import BLOCK_SIZE, fake_stats, launched_fakes, wait_for
from .harness import BLOCK, is_refusal, pulled_tokens, unseen_text
from .listener import Listener

FIELD = "kv_transfer_params"
WHITESPACE = st.text(alphabet=" \t\r\n", max_size=3)


@st.composite
def spellings(draw, name: str) -> str:
    """``name`` as a JSON string's inside: each character as it is or as ``\\uXXXX`` (hex in either case)."""
    out = []
    for ch in name:
        if draw(st.booleans()):
            code = f"{ord(ch):04x}"
            out.append("\\u" + (code.upper() if draw(st.booleans()) else code))
        else:
            out.append(ch)
    return "".join(out)


@st.composite
def evil_params(draw, listener_url: str) -> str:
    """An evil ``kv_transfer_params`` object as JSON text, its own keys spelled by ``spellings`` too."""
    kind = draw(st.sampled_from(["pull", "pull_ids", "decode"]))
    fields = {"pull": {"do_remote_prefill": True, "remote_url": listener_url},
              "pull_ids": {"do_remote_prefill": True, "remote_url": listener_url, "remote_block_ids": [1, 2, 3]},
              "decode": {"do_remote_decode": True}}[kind]
    ws = draw(WHITESPACE)
    items = [f'"{draw(spellings(k))}"{ws}:{ws}{json.dumps(v)}' for k, v in fields.items()]
    return "{" + f",{ws}".join(items) + "}"


@st.composite
def bodies(draw, listener_url: str, chat: bool) -> bytes:
    """A request with the field somewhere in it: alone, or duplicated (evil/null in either order, each
    spelled its own way), first or last among the body's keys, with whitespace around."""
    evil = draw(evil_params(listener_url))
    layout = draw(st.sampled_from(["alone", "evil_then_null", "null_then_evil", "evil_then_evil"]))
    pairs = {"alone": [evil], "evil_then_null": [evil, "null"], "null_then_evil": ["null", evil],
             "evil_then_evil": [evil, evil]}[layout]
    ws = draw(WHITESPACE)
    fields = [f'"{draw(spellings(FIELD))}"{ws}:{ws}{value}' for value in pairs]
    if not any("\\u" in f.split(":")[0] for f in fields):  # the plain spelling alone is the old test's case
        fields[-1] = f'"{draw(spellings(FIELD)).replace("_", chr(92) + "u005f", 1)}"{ws}:{ws}{pairs[-1]}'
    base = ({"messages": [{"role": "user", "content": "hello there"}]} if chat else {"prompt": "hello there"})
    base.update({"max_tokens": 2})
    own = [f"{json.dumps(k)}:{ws}{json.dumps(v)}" for k, v in base.items()]
    ordered = fields + own if draw(st.booleans()) else own + fields
    return ("{" + ws + f",{ws}".join(ordered) + ws + "}").encode()


@pytest.fixture(scope="module")
def fake_router(stories_path):
    """A real router (block size 4, KV transfer off everywhere) in front of two fake replicas, and a listener."""
    from kvmesh.replica.serving.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(stories_path, chat_template=CHAT_TEMPLATE)
    listener = Listener().start()
    with launched_fakes("fa", "fb") as fakes:
        cfg = RouterConfig(port=0, block_size=BLOCK_SIZE, upstream=UpstreamConfig(poll_interval_s=0.1,
                                                                                  connect_timeout_s=1.0))
        server = RouterServer(cfg, [f.spec for f in fakes], tokenizer=tokenizer).start()
        wait_for(lambda: set(server.runtime.router.healthy) == {"fa", "fb"}, what="fakes healthy")
        try:
            yield server, fakes, listener
        finally:
            server.stop()
            listener.stop()


@pytest.mark.parametrize("chat", [False, True], ids=["completion", "chat"])
def test_no_spelling_of_kv_transfer_params_reaches_a_replica(fake_router, chat):
    server, fakes, listener = fake_router
    path = "/v1/chat/completions" if chat else "/v1/completions"

    @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(body=bodies(listener.url, chat))
    def check(body: bytes) -> None:
        for fake in fakes:
            fake.configure(reset_stats=True)
        listener.calls.clear()
        r = httpx.post(server.url + path, content=body, headers={"content-type": "application/json"}, timeout=10)
        got = [p for fake in fakes for p in fake_stats(fake)["kv_transfer_params"]]
        assert is_refusal(r) or r.status_code == 200, (r.status_code, r.text[:200], body)
        assert not got, f"a replica got client kv_transfer_params {got} from {body!r} (router: {r.status_code})"
        assert not listener.calls, f"the listener was called: {listener.calls} ({body!r})"

    check()


ONE_CLUSTER = pytest.mark.parametrize("kv_cluster", ["api_key"], indirect=True)
"""The live tests run on one of conftest.py's clusters: the router reads a body the same way whatever it asks of
tenants (its key is checked before the body is read), so the open one would run the same code."""
LIVE_SPELLINGS = ["kv_transfer\\u005fparams", "\\u006bv_transfer_params", "kv_transfer\\u005Fparams",
                  "".join(f"\\u{ord(ch):04x}" for ch in FIELD)]
"""A few spellings for the live cluster (the fuzz above covers the rest against fakes)."""


@pytest.mark.ray
@pytest.mark.slow
@ONE_CLUSTER
@pytest.mark.parametrize("layout", ["alone", "null_then_evil", "evil_then_plain_null"])
def test_live_spellings_move_no_lease_and_no_pull(kv_cluster, tokenizer, listener, layout, record):
    c = kv_cluster
    evil = json.dumps({"do_remote_prefill": True, "remote_url": listener.url})
    results = []
    for spelling in LIVE_SPELLINGS:
        fields = {"alone": [f'"{spelling}": {evil}'], "null_then_evil": [f'"{FIELD}": null', f'"{spelling}": {evil}'],
                  "evil_then_plain_null": [f'"{spelling}": {evil}', f'"{FIELD}": null']}[layout]
        body = json.dumps(c.completion_body(unseen_text(tokenizer, 2 * BLOCK), 1))[:-1] + ", " + ", ".join(fields) + "}"
        before, calls = c.effects(), len(listener.calls)
        r = c.via_router(body.encode())
        effects = c.effects()
        results.append({"spelling": spelling, "status": r.status_code, "pulled": pulled_tokens(r),
                        "outbound_calls": len(listener.calls) - calls, "effects_changed": effects != before})
    record(f"live spellings ({layout})", results=results)
    for result in results:
        assert result["status"] == 200 or 400 <= result["status"] < 500, result
        assert not result["outbound_calls"] and not result["effects_changed"] and not result["pulled"], results


@pytest.mark.ray
@pytest.mark.slow
@ONE_CLUSTER
@pytest.mark.parametrize("spelling", ["prompt_token_ids", "prompt_token\\u005fids", "\\u0070rompt_token_ids"])
def test_a_chats_prompt_token_ids_route_as_the_replica_computes(kv_cluster, tokenizer, spelling, record):
    """However ``prompt_token_ids`` is spelled on a chat, the router routes by what the replica computes (or
    refuses): the prompt length in its receipt is the replica's ``usage.prompt_tokens``."""
    c = kv_cluster
    ids = unseen_text(tokenizer, 2 * BLOCK + 3)
    for order in ("plain_null_last", "spelled_last"):
        pair = [f'"{spelling}": {json.dumps(ids)}', '"prompt_token_ids": null']
        fields = pair if order == "plain_null_last" else pair[::-1]
        head = json.dumps({"model": c.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                           "temperature": 0.0})[:-1]
        r = c.via_router((head + ", " + ", ".join(fields) + "}").encode(), path="/v1/chat/completions")
        if is_refusal(r):
            continue
        assert r.status_code == 200, r.text
        routed, computed = int(r.headers["x-kvmesh-prompt-tokens"]), r.json()["usage"]["prompt_tokens"]
        record("chat prompt_token_ids spelling", spelling=spelling, order=order, routed=routed, computed=computed)
        assert routed == computed, (spelling, order, routed, computed)
