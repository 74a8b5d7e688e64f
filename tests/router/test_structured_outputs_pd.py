"""Structured outputs across a prefill/decode split: the prefill replica's one token is dropped, the decode replica
samples the answer under the constraint from the pulled KV, as a single replica would (the split's test setup:
tests/router/test_pd_split_engines.py)."""

from __future__ import annotations

import re

import httpx
import pytest
from kvmesh.router.config import ReplicaSpec, RouterConfig, UpstreamConfig
from kvmesh.router.control.router_server import RouterServer
from kvmesh.router.routing.receipts import HEADER_PREFILL, HEADER_PULLED_TOKENS

from ..replica.kv_replicas import KEY, kv_replica
from .conftest import wait_for
from .test_pd_split_engines import PROMPT

pytest.importorskip("xgrammar", reason="structured outputs need xgrammar (the engine extra)")
PATTERN = r"[A-Z][a-z]+ (is|was) [0-9]{2} years old\."
BODY = {"prompt": PROMPT, "max_tokens": 24, "temperature": 0, "structured_outputs": {"regex": PATTERN}}


def test_a_split_request_keeps_its_constraint(stories_path, tokenizer):
    with kv_replica(stories_path) as prefill, kv_replica(stories_path) as decode, kv_replica(stories_path) as alone:
        specs = [ReplicaSpec(prefill.http.url, replica_id="p", role="prefill"),
                 ReplicaSpec(decode.http.url, replica_id="d", role="decode")]
        router = RouterServer(RouterConfig(port=0, upstream=UpstreamConfig(poll_interval_s=0.1, replica_api_key=KEY)),
                              specs, tokenizer=tokenizer).start()
        try:
            wait_for(lambda: len(router.runtime.router.healthy) == 2, timeout=30, what="both replicas healthy")
            r = httpx.post(router.url + "/v1/completions", json=BODY, headers={"x-kvmesh-receipt": "1"}, timeout=120)
            assert r.status_code == 200, r.text
            assert r.headers["x-kvmesh-replica"] == "d" and r.headers[HEADER_PREFILL] == "p"
            assert int(r.headers[HEADER_PULLED_TOKENS]) >= 384
            single = httpx.post(alone.http.url + "/v1/completions", json=BODY, timeout=120,
                                headers={"Authorization": f"Bearer {KEY}"})
            text = r.json()["choices"][0]["text"]
            assert re.fullmatch(PATTERN, text) and text == single.json()["choices"][0]["text"]
        finally:
            router.stop()
