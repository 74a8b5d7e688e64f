"""Several router processes (``router_workers``) share their stored responses: a conversation stored through one
worker is read and continued through another, and the file they share keeps it after the workers stop."""

from __future__ import annotations

import time

import httpx
from kvmesh.replica.openai.responses_api.sqlite_store import SQLiteResponseStore
from kvmesh.replica.openai.responses_api.store import StoredResponse
from kvmesh.replica.openai.responses_api.store_config import ResponsesStoreConfig
from kvmesh.router.control.workers import WORKER_HEADER, router_workers

from . import responses_cluster
from .responses_cluster import CHATML_TOOLS_TEMPLATE, FRONTEND, TENANT_KEYS

cluster = responses_cluster.cluster  # the fixture
AUTH = {"Authorization": f"Bearer {TENANT_KEYS['ann']}"}
WORKER = WORKER_HEADER.decode()


def create(port: int, **body) -> httpx.Response:
    """One request on a connection of its own (the kernel hands each new connection to either worker)."""
    r = httpx.post(f"http://127.0.0.1:{port}/v1/responses", headers=AUTH, timeout=120,
                   json={"model": "stories", "max_output_tokens": 2, **body})
    assert r.status_code == 200, r.text
    return r


def test_a_conversation_stored_by_one_worker_is_continued_by_another(cluster, stories_path, tmp_path):
    shared = tmp_path / "responses.sqlite3"
    config = cluster.config(model=str(stories_path), tokenizer=str(stories_path), workers=2,
                            responses=ResponsesStoreConfig(path=str(shared)))
    assert config.frontend.chat_template == CHATML_TOOLS_TEMPLATE == FRONTEND.chat_template
    pool = router_workers(config, cluster.specs, 2).start()
    try:
        deadline = time.monotonic() + 120
        while True:  # until both workers answer (each starts its own router)
            try:
                root = create(pool.port, input="Once upon a time")
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the router workers did not start"
                time.sleep(0.5)
        stored_by, others = root.headers[WORKER], []
        for _ in range(40):
            turn = create(pool.port, input="Then?", previous_response_id=root.json()["id"])
            if turn.headers[WORKER] != stored_by:
                others.append(turn)
                break
        assert others, f"every continuation went to worker {stored_by}"
        read = httpx.get(f"http://127.0.0.1:{pool.port}/v1/responses/{others[0].json()['id']}", headers=AUTH,
                         timeout=30)
        assert read.status_code == 200 and read.json()["previous_response_id"] == root.json()["id"]
    finally:
        pool.stop(timeout_s=10)
    kept = SQLiteResponseStore(FRONTEND, str(shared))  # what a restarted router opens
    assert isinstance(kept.get("ann", others[0].json()["id"]), StoredResponse)
    assert kept.get("bob", others[0].json()["id"]) is None
    kept.close()
