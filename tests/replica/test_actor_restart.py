"""The replica as a Ray actor: serves through its reported HTTP endpoint; a killed actor comes back empty and says
so."""

from __future__ import annotations

import time
from dataclasses import replace

import httpx
import pytest
import zmq
from kvmesh.events.codec import decode_batch
from kvmesh.events.schema import AllBlocksCleared, BlockStored
from kvmesh.events.wire import END_SEQ, pack_seq, unpack_seq
from kvmesh.replica.actor import ACTOR_SERVER, ReplicaOptions, start_replica_actor
from kvmesh.replica.config import EngineConfig

pytestmark = pytest.mark.ray

PROMPT = list(range(3, 3 + 40))  # 2 full blocks of 16 tokens, then 8 more


def replay(endpoint: str, start_seq: int = 0) -> list[tuple[int, object]]:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 10_000)
    sock.connect(endpoint)
    try:
        sock.send_multipart([b"", pack_seq(start_seq)])
        out = []
        while (frames := sock.recv_multipart())[-2] != END_SEQ:
            out.append((unpack_seq(frames[-2]), decode_batch(frames[-1])))
        return out
    finally:
        sock.close()


def complete(url: str) -> dict:
    r = httpx.post(f"{url}/v1/completions", json={"prompt": PROMPT, "max_tokens": 2, "temperature": 0}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_actor_serves_then_restarts_with_empty_cache_announced(ray_session, stories_path):
    options = ReplicaOptions(engine=EngineConfig(model=str(stories_path), kv_cache_memory=4 << 20),
                             replica_id="r0", server=replace(ACTOR_SERVER, host="127.0.0.1"))
    actor = start_replica_actor(options, max_restarts=1)
    try:
        first = ray_session.get(actor.ready.remote(), timeout=180)
        assert first["restarted"] is False and first["block_size"] == 16 and first["http_url"].startswith("http://")
        complete(first["http_url"])
        assert complete(first["http_url"])["usage"]["prompt_tokens_details"]["cached_tokens"] == 32
        assert any(isinstance(e, BlockStored) for _, b in replay(first["replay_endpoint"]) for e in b.events)
        assert ray_session.get(actor.health.remote())["healthy"] is True

        ray_session.kill(actor, no_restart=False)
        deadline, second = time.monotonic() + 180, None
        while time.monotonic() < deadline:
            try:
                second = ray_session.get(actor.endpoints.remote(), timeout=30)
            except Exception:  # noqa: BLE001 - restarting
                time.sleep(0.5)
                continue
            if second["pid"] != first["pid"]:
                break
        assert second is not None and second["pid"] != first["pid"] and second["restarted"] is True

        batches = replay(second["replay_endpoint"])
        assert batches[0][0] == 0 and batches[0][1].events == [AllBlocksCleared()]
        assert complete(second["http_url"])["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    finally:
        ray_session.kill(actor, no_restart=True)
