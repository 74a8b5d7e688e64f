"""Every field of vLLM's completion and chat request models is implemented, refused or listed as ignored.

tests/data/vllm_request_fields.json lists the fields (read from vLLM's source; it says which version) with
kvmesh's answer to each. This walk sends each field to a replica and through the router and checks that
answer: an implemented field shows its effect (tests/vllm_field_probes.py), a refused one set to anything but
vLLM's default is a 400 naming it while the default is served, an ignored one is served and docs/openai-api.md says why.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from kvmesh.replica.openai.refused_fields import BOTH, CHAT_ONLY, COMPLETION_ONLY, Refusal

from . import openai_pair, vllm_field_probes
from .openai_pair import AUTH, HI
from .test_openai_unsupported_docs import IGNORED_VALUES, ignored_params
from .vllm_field_probes import ok, refused

pair = openai_pair.pair  # the fixture
DATA = json.loads((Path(__file__).parent / "data" / "vllm_request_fields.json").read_text())
BASE = {"completions": ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}),
        "chat": ("/v1/chat/completions", {"messages": HI, "max_tokens": 8, "temperature": 0})}
PROBES = {"completions": vllm_field_probes.COMPLETIONS, "chat": vllm_field_probes.CHAT}
REFUSED = {"completions": BOTH | COMPLETION_ONLY | {"suffix": Refusal("", (None, ""))},
           "chat": BOTH | CHAT_ONLY}
SET = {  # a value each refused field means something with
    "use_beam_search": True, "length_penalty": 2.0, "watermarking": True,
    "logprob_token_ids": [5], "bad_words": ["cat"], "ec_transfer_params": {"k": 1},
    "vllm_xargs": {"k": 1}, "repetition_detection": {"max_pattern_size": 4}, "thinking_token_budget": 16,
    "logits_processors": ["module.Processor"], "prompt_embeds": "AAAA", "suffix": "The end.",
    "best_of": 2,
    "return_prompt_text": True, "media_io_kwargs": {"image": {"k": 1}}, "mm_processor_kwargs": {"k": 1},
    "functions": [{"name": "f", "parameters": {}}], "function_call": "auto", "audio": {"voice": "alloy"},
    "modalities": ["text", "audio"], "prediction": {"type": "content", "content": "x"},
    "web_search_options": {}, "guided_whitespace_pattern": "[ ]?",
    "structural_tag": json.dumps({"type": "structural_tag", "structures": [], "triggers": []}),
}


@pytest.fixture(scope="module")
def client():
    """One client for the walk's ~1,000 requests: an ``httpx.post`` builds a client, and its TLS context, each call
    (~60 ms of CPU)."""
    with httpx.Client(headers=AUTH, timeout=60) as c:
        yield c


def walk(answer: str) -> list[tuple[str, str]]:
    return [(endpoint, name) for endpoint in ("completions", "chat") for name, a in DATA[endpoint].items()
            if a == answer]


def asker(client: httpx.Client, url: str, endpoint: str):
    path, base = BASE[endpoint]
    return lambda fields: client.post(url + path, json={**base, **fields})


def test_the_list_says_where_it_came_from_and_covers_both_models():
    assert all(source["repository"] in ("vllm-project/vllm", "openai/openai-python") and len(source["commit"]) == 40
               for source in DATA["sources"])
    assert len(DATA["completions"]) >= 50 and len(DATA["chat"]) >= 60
    assert set(DATA["completions"].values()) | set(DATA["chat"].values()) <= {
        "implemented", "refused", "ignored"}


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_the_servers_refuse_exactly_the_listed_fields(endpoint):
    listed = {name for name, answer in DATA[endpoint].items() if answer == "refused"}
    assert listed == set(REFUSED[endpoint])


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_every_implemented_field_has_a_probe(endpoint):
    listed = {name for name, answer in DATA[endpoint].items() if answer == "implemented"}
    assert listed == set(PROBES[endpoint])


@pytest.mark.parametrize("endpoint, name", walk("implemented"))
def test_an_implemented_field_shows_its_effect(pair, client, endpoint, name):
    for url in pair:
        PROBES[endpoint][name](asker(client, url, endpoint))


@pytest.mark.parametrize("endpoint, name", walk("refused"))
def test_a_refused_field_is_a_400_naming_it_and_its_default_is_served(pair, client, endpoint, name):
    for url in pair:
        ask = asker(client, url, endpoint)
        assert refused(ask({name: SET[name]}), name), (url, name)
        ok(ask({name: REFUSED[endpoint][name].unset[-1]}))


@pytest.mark.parametrize("endpoint, name", walk("ignored"))
def test_an_ignored_field_is_served_and_the_readme_says_why(pair, client, endpoint, name):
    assert name in ignored_params()
    for url in pair:
        ok(asker(client, url, endpoint)({name: IGNORED_VALUES.get(name, 1)}))


@pytest.mark.parametrize("path, body", [("/v1/completions/render", {"prompt": "Once upon a time"}),
                                        ("/v1/chat/completions/render", {"messages": HI})])
def test_the_render_routes_refuse_token_offsets_they_do_not_return(pair, client, path, body):
    for url in pair:
        r = client.post(url + path, json={**body, "return_token_offsets": True})
        assert refused(r, "return_token_offsets"), (url, r.text)
        assert client.post(url + path, json={**body, "return_token_offsets": False}).status_code == 200
