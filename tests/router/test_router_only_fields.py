"""A client never sets the router's own fields (router/http/router_only.py), however it spells them.

Each body goes through a real router to a fake replica that records every ``kv_transfer_params`` it receives
(``/fake/stats``): a spelling the router let through would show there. The router decides on the decoded body,
as the replica decodes it: escapes resolved, the last duplicate key winning.
"""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .conftest import fake_stats, launched_fakes, wait_for

KEY = "kv_transfer_params"
EVIL = '{"do_remote_prefill": true, "remote_url": "http://127.0.0.1:9/steal"}'
PATHS = {"/v1/completions": '"prompt": "Once upon a time", "max_tokens": 2',
         "/v1/chat/completions": '"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2'}


@pytest.fixture(scope="module")
def routed():
    """(router URL, the fake replica behind it) for the whole module: hypothesis runs many bodies."""
    from kvmesh.router.config import RouterConfig, UpstreamConfig
    from kvmesh.router.control.router_server import RouterServer

    with launched_fakes("only") as (fake,):
        router = RouterServer(RouterConfig(port=0, block_size=4, upstream=UpstreamConfig(poll_interval_s=0.1)),
                              [fake.spec]).start()
        try:
            wait_for(lambda: httpx.get(router.url + "/health").status_code == 200, what="the replica healthy")
            yield router.url, fake
        finally:
            router.stop()


def _escaped(ch: str, upper: bool) -> str:
    code = f"{ord(ch):04x}"
    return "\\u" + (code.upper() if upper else code)


@st.composite
def spellings(draw, name: str = KEY) -> str:
    """The JSON string literal of ``name`` with any subset of its characters written as \\u escapes."""
    chars = [_escaped(ch, draw(st.booleans())) if draw(st.booleans()) else ch for ch in name]
    return '"' + "".join(chars) + '"'


SPACE = st.sampled_from(["", " ", "\n", "\t ", "\r\n  "])


@st.composite
def bodies_with_the_field(draw) -> tuple[str, str]:
    """(path, raw body) whose decoded top level has ``kv_transfer_params``: one key, or duplicates in which the
    evil value comes first or last."""
    path = draw(st.sampled_from(sorted(PATHS)))
    ws = draw(SPACE)
    key, other = draw(spellings()), draw(spellings())
    shape = draw(st.sampled_from(["one", "evil_then_null", "null_then_evil"]))
    stream = draw(st.booleans())
    if shape == "one":
        fields = [f"{key}{ws}:{ws}{EVIL}"]
    elif shape == "evil_then_null":
        fields = [f"{key}{ws}:{ws}{EVIL}", f"{other}:{ws}null"]
    else:
        fields = [f"{other}:null", f"{key}{ws}:{ws}{EVIL}"]
    head = PATHS[path] + f', "stream": {"true" if stream else "false"}'
    order = draw(st.booleans())
    inner = [head, *fields] if order else [*fields, head]
    return path, "{" + ws + ("," + ws).join(inner) + ws + "}"


def _post(url: str, path: str, raw: str) -> httpx.Response:
    return httpx.post(url + path, content=raw.encode(), headers={"content-type": "application/json"}, timeout=10)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=bodies_with_the_field())
def test_kv_transfer_params_is_refused_in_every_spelling(routed, case):
    url, fake = routed
    path, raw = case
    assert KEY in json.loads(raw)  # the decoder's view: the field is there
    r = _post(url, path, raw)
    assert r.status_code == 400, (raw, r.text)
    assert r.json()["error"]["param"] == KEY
    assert fake_stats(fake)["kv_transfer_params"] == []  # nothing the client chose reached the replica


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(sorted(PATHS)), key=spellings(), holder=st.sampled_from(["metadata", "extra"]))
def test_the_name_nested_in_another_object_reaches_no_replica_as_the_field(routed, path, key, holder):
    url, fake = routed
    fake.configure(reset_stats=True)
    raw = "{" + PATHS[path] + f', "{holder}": {{{key}: {EVIL}}}' + "}"
    r = _post(url, path, raw)
    assert r.status_code == 200, r.text
    assert fake_stats(fake)["kv_transfer_params"] == []


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=spellings("prompt_token_ids"), value=st.sampled_from(["[1, 2, 3]", "null", "[]"]))
def test_a_chats_prompt_token_ids_is_refused_in_every_spelling(routed, key, value):
    url, _ = routed
    r = _post(url, "/v1/chat/completions", "{" + PATHS["/v1/chat/completions"] + f", {key}: {value}" + "}")
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "prompt_token_ids" and "the router sets it" in error["message"]


@pytest.mark.parametrize("path", ["/v1/completions/render", "/v1/chat/completions/render"])
def test_render_paths_refuse_router_only_fields_too(routed, path):
    url, _ = routed
    body = PATHS[path.removesuffix("/render")]
    r = _post(url, path, "{" + body + ', "kv_transfer\\u005fparams": null}')
    assert r.status_code == 400 and r.json()["error"]["param"] == KEY
