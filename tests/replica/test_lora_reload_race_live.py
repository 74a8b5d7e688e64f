"""An adapter reloaded over HTTP while streams run under its name, on a real stories260K replica: four clients stream
greedy completions of adapter ``x`` one after the other while the admin unloads ``x`` and loads it again from the
other weights, eight times. Every answer is exactly the old or the new weights' text (as adapters loaded from each
directory under names of their own give it), none a mix; requests sent between an unload and the next load get
vLLM's 404."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from .lora_fixtures import make_adapter

pytest.importorskip("peft")

ADMIN = "admin-key-00002"
PROMPT = "Once upon a time, there was a little girl named Lily. She loved to play in the park"
BODY = {"prompt": PROMPT, "max_tokens": 32, "temperature": 0, "ignore_eos": True, "stream": True}
CLIENTS = 4
RELOADS = 8


@pytest.fixture(scope="module")
def replica(stories_path, tmp_path_factory):
    from kvmesh.replica.config import EngineConfig
    from kvmesh.replica.runtime import ReplicaRuntime
    from kvmesh.replica.server.config import ReplicaServerConfig

    root = tmp_path_factory.mktemp("race")
    make_adapter(stories_path, root / "old", seed=21)
    make_adapter(stories_path, root / "new", seed=22)
    engine = EngineConfig(model=str(stories_path), dtype="float32", kv_cache_memory=4 << 20, enable_lora=True,
                          max_loras=2, max_lora_rank=8,
                          lora_modules={"ref-old": str(root / "old"), "ref-new": str(root / "new"),
                                        "x": str(root / "old")})
    runtime = ReplicaRuntime.start(engine, ReplicaServerConfig(port=0, event_port=0, replay_port=0, admin_key=ADMIN))
    try:
        yield runtime.http.url, root
    finally:
        runtime.shutdown(graceful_s=1)


def stream(client: httpx.Client, url: str, model: str) -> tuple[int, str]:
    """One streamed completion: its status and the text of its chunks."""
    with client.stream("POST", url + "/v1/completions", json={**BODY, "model": model}) as r:
        if r.status_code != 200:
            r.read()
            return r.status_code, ""
        text = []
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                text += [c["text"] for c in json.loads(line[6:])["choices"]]
        return 200, "".join(text)


def admin(url: str, path: str, body: dict) -> None:
    r = httpx.post(url + path, json=body, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=60)
    assert r.status_code == 200, r.text


def test_streams_under_a_reloaded_name_each_get_one_version(replica):
    url, root = replica
    with httpx.Client(timeout=60) as client:
        texts = {stream(client, url, f"ref-{v}")[1] for v in ("old", "new")}
    assert len(texts) == 2  # the two weights write different texts
    answers: list[tuple[int, str]] = []
    stop = threading.Event()

    def client_loop() -> None:
        with httpx.Client(timeout=60) as client:
            while not stop.is_set():
                answers.append(stream(client, url, "x"))

    threads = [threading.Thread(target=client_loop) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    try:
        for i in range(RELOADS):
            time.sleep(0.4)
            admin(url, "/v1/unload_lora_adapter", {"lora_name": "x"})
            admin(url, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": str(root / ("new", "old")[i % 2])})
        time.sleep(0.4)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    served = [text for status, text in answers if status == 200]
    assert {status for status, _ in answers} <= {200, 404}
    mixed = [text for text in served if text not in texts]
    assert not mixed, f"{len(mixed)} of {len(served)} answers are neither version's text"
    assert set(served) == texts and len(served) >= 2 * RELOADS
