"""Penalties and min_p over HTTP: applied (transformers' greedy tokens with repetition_penalty), and a 400 naming the
field outside vLLM's ranges."""

from __future__ import annotations

import httpx
import pytest

from .stories_replica import stories_replica

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def client(stories_path):
    with stories_replica(stories_path, max_num_seqs=8, dtype="float32") as runtime, \
            httpx.Client(base_url=runtime.http.url, timeout=60) as c:
        yield c


def test_repetition_penalty_gives_transformers_greedy_tokens(client, stories_path):
    body = {"prompt": "Once upon a time", "temperature": 0, "max_tokens": 48, "ignore_eos": True,
            "repetition_penalty": 1.3, "logprobs": 0, "return_tokens_as_token_ids": True}
    choice = client.post("/v1/completions", json=body).json()["choices"][0]
    prompt = client.post("/tokenize", json={"prompt": "Once upon a time"}).json()["tokens"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(stories_path, dtype=torch.float32).eval()
    ids = torch.tensor([prompt])
    ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=48, do_sample=False,
                      repetition_penalty=1.3, pad_token_id=0, eos_token_id=None)[0, len(prompt):].tolist()
    assert [int(t.removeprefix("token_id:")) for t in choice["logprobs"]["tokens"]] == ref


@pytest.mark.parametrize("field, value", [("frequency_penalty", 2.5), ("presence_penalty", -3),
                                          ("repetition_penalty", 0), ("min_p", 1.5)])
def test_values_outside_vllms_ranges_are_400_naming_the_field(client, field, value):
    for path, body in (("/v1/completions", {"prompt": "hi"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})):
        r = client.post(path, json={**body, field: value, "max_tokens": 2})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == field and field in r.json()["error"]["message"]
