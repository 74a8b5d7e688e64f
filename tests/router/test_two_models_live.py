"""One router in front of two base models -- stories260K and the embedded model -- each on
its own replica. Each model's answers through the router equal its replica's own (greedy), the router tokenizes
each model's requests with that model's tokenizer (loaded from the path the embedded replica reports) and
forwards the token ids, and an unknown model gets 404."""

from __future__ import annotations

import httpx
import pytest
from kvmesh.router.config import ReplicaSpec, RouterConfig, UpstreamConfig
from kvmesh.router.control.router_server import RouterServer

from .conftest import wait_for

PROMPT = "Once upon a time there was a little robot who lived in a big server room. Every day the robot"


@pytest.fixture(scope="module")
def two_models(stories_path, tokenizer, tmp_path_factory):
    pytest.importorskip("tokenizers")
    from kvmesh.cluster.launch.embedded_model import SERVED_NAME, embedded_model_files, materialize
    from kvmesh.replica.config import EngineConfig
    from kvmesh.replica.openai.config import FrontendConfig
    from kvmesh.replica.runtime import ReplicaRuntime
    from kvmesh.replica.server.config import ReplicaServerConfig

    from ..conftest import CHAT_TEMPLATE

    embedded = materialize(embedded_model_files(), tmp_path_factory.mktemp("embedded"))
    engines = {"stories": (EngineConfig(model=str(stories_path), kv_cache_memory=4 << 20, max_num_seqs=8), None),
               SERVED_NAME: (EngineConfig(model=embedded, load_format="dummy", kv_cache_memory=4 << 20,
                                          max_num_seqs=8), SERVED_NAME)}
    runtimes = {}
    try:
        for name, (engine, served) in engines.items():
            runtimes[name] = ReplicaRuntime.start(
                engine, ReplicaServerConfig(port=0, event_port=0, replay_port=0, served_model_name=served),
                frontend=FrontendConfig(chat_template=CHAT_TEMPLATE))
        specs = [ReplicaSpec(rt.http.url, rt.endpoints()["events_endpoint"], rt.endpoints()["replay_endpoint"],
                             replica_id=name) for name, rt in runtimes.items()]
        router = RouterServer(RouterConfig(port=0, model=str(stories_path), block_size=16,
                                           upstream=UpstreamConfig(poll_interval_s=0.2),
                                           frontend=FrontendConfig(chat_template=CHAT_TEMPLATE)),
                              specs, tokenizer=tokenizer).start()
        try:
            wait_for(lambda: len(router.runtime.router.healthy) == 2, timeout=30, what="both replicas healthy")
            yield router, {name: rt.http.url for name, rt in runtimes.items()}, str(stories_path)
        finally:
            router.stop()
    finally:
        for rt in runtimes.values():
            rt.shutdown(graceful_s=0.5)


def completion(url: str, model: str, **extra) -> dict:
    body = {"model": model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "logprobs": 1, **extra}
    r = httpx.post(url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def test_each_models_answers_through_the_router_equal_its_replicas(two_models):
    router, direct, stories = two_models
    runtime = router.runtime
    assert set(runtime.models.catalog.bases()) == {stories, "kvmesh-embedded"}
    accepts = {r.id: r.accepts for r in runtime.replicas if r.accepts is not None}
    assert accepts == {"stories": "kvmesh", "kvmesh-embedded": "kvmesh"}  # token ids go to both
    assert runtime.router.degraded == {}  # each fingerprint matches its own model's tokenizer
    own, embedded = runtime.tokenizer, runtime.models.tokenizer_of(runtime.replicas.get("kvmesh-embedded"))
    assert embedded is not None and embedded.fingerprint != own.fingerprint
    assert runtime.models.tokenizer_of(runtime.replicas.get("stories")) is own
    for replica, model in (("stories", stories), ("kvmesh-embedded", "kvmesh-embedded")):
        through, own_answer = completion(router.url, model), completion(direct[replica], model)
        assert through["text"] == own_answer["text"], model  # logprobs to float noise: the second call may hit
        assert through["logprobs"]["tokens"] == own_answer["logprobs"]["tokens"], model  # the prefix cache
        assert through["logprobs"]["token_logprobs"] == pytest.approx(own_answer["logprobs"]["token_logprobs"],
                                                                      abs=1e-4), model
        assert through["logprobs"]["tokens"]  # an answer, not an empty one
    assert completion(router.url, "kvmesh-embedded")["text"] != completion(router.url, stories)["text"]
    unknown = httpx.post(router.url + "/v1/completions", json={"model": "gpt-4", "prompt": "hi"}, timeout=10)
    assert unknown.status_code == 404 and "`gpt-4` does not exist" in unknown.json()["error"]["message"]
    cards = httpx.get(router.url + "/v1/models", timeout=10).json()["data"]
    assert sorted(c["id"] for c in cards) == sorted([stories, "kvmesh-embedded"])
    tokenize = httpx.post(router.url + "/tokenize", json={"model": "kvmesh-embedded", "prompt": "hi"}, timeout=10)
    assert tokenize.status_code == 400 and "its replicas" in tokenize.json()["error"]["message"]  # not wrong ids
    assert httpx.post(router.url + "/tokenize", json={"model": stories, "prompt": "hi"}, timeout=10).status_code == 200
