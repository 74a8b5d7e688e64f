"""logprobs / top_logprobs / echo / logit_bias over HTTP against a replica serving stories260K, in vLLM's shapes."""

from __future__ import annotations

import json

import httpx
import pytest
from kvmesh.replica.openai.logprobs_format import token_decoder

from .stories_replica import stories_replica

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

STORY = ("Once upon a time, there was a little girl named Lily. She loved to play in the park with her "
         "big red ball.")
TOL = 1e-4


@pytest.fixture(scope="module")
def replica(stories_path):
    with stories_replica(stories_path, max_num_seqs=32, dtype="float32") as runtime:
        yield runtime


@pytest.fixture(scope="module")
def client(replica):
    with httpx.Client(base_url=replica.http.url, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def hf(stories_path):
    return transformers.AutoModelForCausalLM.from_pretrained(stories_path, dtype=torch.float32).eval()


def reference_logprobs(hf, token_ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(hf(torch.tensor([token_ids])).logits[0].float(), dim=-1)


def sse_chunks(text: str) -> list[dict]:
    events = [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def complete(client, **body) -> dict:
    r = client.post("/v1/completions", json={"prompt": STORY, "temperature": 0, "max_tokens": 4, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_echo_with_logprobs_scores_every_prompt_token_like_transformers(client, replica, hf):
    body = complete(client, echo=True, logprobs=1, max_tokens=1)  # what lm-evaluation-harness sends
    choice = body["choices"][0]
    ids = replica.state.tokenizer.render_completion(STORY)
    lp = choice["logprobs"]
    assert choice["text"].startswith(STORY)
    assert len(lp["tokens"]) == len(ids) + 1 and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    ref = reference_logprobs(hf, ids + [0])
    for pos in range(1, len(ids)):
        assert lp["token_logprobs"][pos] == pytest.approx(ref[pos - 1][ids[pos]].item(), abs=TOL)
        assert max(lp["top_logprobs"][pos].values()) == pytest.approx(ref[pos - 1].max().item(), abs=TOL)
    generated = ref[len(ids) - 1]
    assert lp["token_logprobs"][-1] == pytest.approx(generated.max().item(), abs=TOL)  # greedy token
    assert lp["text_offset"] == sorted(lp["text_offset"]) and lp["text_offset"][0] == 0


def test_echo_without_logprobs_returns_the_prompt_text_first(client):
    plain = complete(client)["choices"][0]["text"]
    echoed = complete(client, echo=True)["choices"][0]
    assert echoed["text"] == STORY + plain and echoed["logprobs"] is None


def test_completion_logprobs_top_k_plus_chosen(client):
    lp = complete(client, logprobs=3)["choices"][0]["logprobs"]
    assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert len(lp["tokens"]) == 4 and all(len(top) == 3 for top in lp["top_logprobs"])  # greedy: chosen is top-1
    for token, logprob, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True):
        assert top[token] == logprob == max(top.values())


def test_streamed_logprobs_equal_non_streamed(client):
    whole = complete(client, logprobs=2, echo=True)["choices"][0]
    chunks = sse_chunks(client.post("/v1/completions", json={
        "prompt": STORY, "temperature": 0, "max_tokens": 4, "logprobs": 2, "echo": True, "stream": True}).text)
    streamed = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for c in chunks:
        for key in streamed:
            streamed[key] += c["choices"][0]["logprobs"][key]
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["text"]
    assert streamed["tokens"] == whole["logprobs"]["tokens"]
    assert streamed["text_offset"] == whole["logprobs"]["text_offset"]
    assert streamed["token_logprobs"][1:] == pytest.approx(whole["logprobs"]["token_logprobs"][1:], abs=TOL)


def test_chat_logprobs_in_openai_shape_streamed_and_not(client):
    req = {"messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 5, "temperature": 0,
           "logprobs": True, "top_logprobs": 2}
    r = client.post("/v1/chat/completions", json=req)
    assert r.status_code == 200, r.text
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert len(content) == 5
    for item in content:
        assert set(item) == {"token", "logprob", "bytes", "top_logprobs"}
        assert item["bytes"] == list(item["token"].encode())
        assert len(item["top_logprobs"]) == 2 and item["top_logprobs"][0]["token"] == item["token"]
    chunks = sse_chunks(client.post("/v1/chat/completions", json={**req, "stream": True}).text)
    streamed = [i for c in chunks if c["choices"] and c["choices"][0]["logprobs"]
                for i in c["choices"][0]["logprobs"]["content"]]
    assert [i["token"] for i in streamed] == [i["token"] for i in content]
    no_lp = client.post("/v1/chat/completions", json={**req, "logprobs": False, "top_logprobs": None}).json()
    assert no_lp["choices"][0]["logprobs"] is None


def test_logit_bias_is_applied(client, replica):
    token = token_decoder(replica.state.tokenizer.hf)(100)
    plain = complete(client, max_tokens=3, logprobs=0, ignore_eos=True)["choices"][0]["logprobs"]["tokens"]
    forced = complete(client, max_tokens=3, logprobs=0, ignore_eos=True, logit_bias={"100": 100})["choices"][0]
    assert token not in plain and forced["logprobs"]["tokens"] == [token] * 3
    assert forced["logprobs"]["token_logprobs"][0] < -1.0  # reported from the raw distribution, not the biased


@pytest.mark.parametrize("body, word", [
    ({"logit_bias": {"512": 1}}, "outside the vocabulary"),
    ({"logit_bias": {"5": -100.5}}, "[-100, 100]"),
    ({"logit_bias": {"five": 1}}, "token ids"),
    ({"logprobs": 21}, "logprobs"),
    ({"n": 2, "best_of": 1}, "best_of"),
])
def test_bad_logprobs_and_bias_values_are_400(client, body, word):
    r = client.post("/v1/completions", json={"prompt": "hi", **body})
    assert r.status_code == 400, r.text
    assert word in r.json()["error"]["message"]


def test_echo_with_max_tokens_0_returns_only_the_prompt_and_its_logprobs(client):
    with_one = complete(client, echo=True, logprobs=1, max_tokens=1)
    body = complete(client, echo=True, logprobs=1, max_tokens=0)
    choice = body["choices"][0]
    assert choice["text"] == STORY and choice["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 0
    expected = {k: v[:-1] for k, v in with_one["choices"][0]["logprobs"].items()}  # without the sampled token
    assert choice["logprobs"]["tokens"] == expected["tokens"]
    assert choice["logprobs"]["token_logprobs"][1:] == pytest.approx(expected["token_logprobs"][1:], abs=TOL)
    chunks = sse_chunks(client.post("/v1/completions", json={
        "prompt": STORY, "max_tokens": 0, "echo": True, "logprobs": 1, "stream": True}).text)
    assert "".join(c["choices"][0]["text"] for c in chunks) == STORY
    assert sum(len(c["choices"][0]["logprobs"]["tokens"]) for c in chunks) == len(expected["tokens"])
    assert client.post("/v1/completions", json={"prompt": STORY, "max_tokens": 0}).status_code == 400
