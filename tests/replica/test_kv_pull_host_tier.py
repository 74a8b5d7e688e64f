"""A holder's prefix that its device evicted but its host tier kept is pulled from host memory: the lease names
those blocks as ``"CPU"`` ones, the puller reads them from the holder's host tier (``local`` transport and nixl,
real stories260K, real HTTP) and answers the same greedy text with the pulled tokens cached."""

from __future__ import annotations

import random

import pytest
from kvmesh.replica.kv_transfer.nixl_agent import nixl_missing

from .kv_replicas import client, kv_replica, register

PROMPT = [random.Random(51).randrange(3, 500) for _ in range(428)]  # 26 full blocks of 16 and 12 tokens
FILLERS = [[random.Random(52 + i).randrange(3, 500) for _ in range(480)] for i in range(2)]  # 30 blocks each
BODY = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
HOLDER = {"num_kv_blocks": 40, "kv_offload_memory": 4 << 20}  # 39 device blocks; a host tier of ~200


@pytest.fixture(scope="module", params=["local", "nixl"])
def holder(request, stories_path):
    """A replica with a small device cache and a host tier; ``local`` transport, and nixl (host memory
    registered with UCX) where it is installed."""
    if request.param == "nixl" and nixl_missing() is not None:
        pytest.skip(nixl_missing())
    with kv_replica(stories_path, transport=request.param, **HOLDER) as a:
        yield a


def _lease_media(c) -> list[str]:
    lease = c.post("/kv/lease", json={"prompt_token_ids": PROMPT}).json()
    assert c.post("/kv/release", json={"lease_id": lease["lease_id"]}).status_code == 200
    return lease["remote_block_media"]


def _pull_from(holder, stories_path) -> tuple[str, dict]:
    """A fresh replica pulls PROMPT from ``holder``; (its text, the pull's headers), after checking the reference."""
    with kv_replica(stories_path, transport=holder.state.kv_transfer.config.transport) as b, client(b) as cb:
        register(b, holder)
        reference = cb.post("/v1/completions", json={**BODY, "cache_salt": "computed"}).json()["choices"][0]["text"]
        r = cb.post("/v1/completions", json={**BODY, "kv_transfer_params": {"do_remote_prefill": True,
                                                                             "remote_url": holder.http.url}})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 416
        assert r.json()["choices"][0]["text"] == reference
        return r.json()["choices"][0]["text"], dict(r.headers)


def test_the_handshake_describes_both_tiers(holder):
    from kvmesh.replica.kv_transfer.agent import decode_handshake

    with client(holder) as c:
        handshake = decode_handshake(c.get("/kv/handshake").content)
    assert handshake.host_layout is not None and handshake.host_layout.num_blocks > 100
    assert handshake.host_layout.bytes_per_block == handshake.layout.bytes_per_block


def test_a_prefix_split_between_device_and_host_tier_is_pulled_from_both(holder, stories_path):
    with client(holder) as c:
        assert c.post("/v1/completions", json={**BODY, "max_tokens": 1}).status_code == 200
        assert c.post("/v1/completions", json={"prompt": FILLERS[0], "max_tokens": 1}).status_code == 200
        assert _lease_media(c) == ["CPU"] * 26  # the filler evicted the prompt's head from the device
        # the prompt's first 10 blocks come back to the device (a load-back); the rest stay in host memory only
        assert c.post("/v1/completions", json={"prompt": PROMPT[:170], "max_tokens": 1}).status_code == 200
        media = _lease_media(c)
        assert media == ["GPU"] * 10 + ["CPU"] * 16
    _, headers = _pull_from(holder, stories_path)
    assert headers["x-kvmesh-kv-pull"] == "ok" and headers["x-kvmesh-kv-pulled-tokens"] == "416"


def test_a_prefix_only_in_the_holders_host_tier_is_pulled_from_host_memory(holder, stories_path):
    with client(holder) as c:
        assert c.post("/v1/completions", json={**BODY, "max_tokens": 1}).status_code == 200
        for filler in FILLERS:  # together more than the device holds: the prompt leaves the device entirely
            assert c.post("/v1/completions", json={"prompt": filler, "max_tokens": 1}).status_code == 200
        assert _lease_media(c) == ["CPU"] * 26
    _, headers = _pull_from(holder, stories_path)
    assert headers["x-kvmesh-kv-pull"] == "ok" and headers["x-kvmesh-kv-pulled-tokens"] == "416"
    with client(holder) as c:  # the pull's lease held the host blocks and let them go
        assert c.get("/load").json()["kv_transfer"]["enabled"]
        assert _lease_media(c) == ["CPU"] * 26


def test_block_media_that_do_not_match_the_block_ids_are_a_400_naming_the_field(holder):
    with client(holder) as c:
        r = c.post("/v1/completions", json={**BODY, "kv_transfer_params": {
            "do_remote_prefill": True, "remote_url": holder.http.url, "remote_block_ids": [1, 2],
            "remote_block_media": ["CPU"]}})
        assert r.status_code == 400 and r.json()["error"]["param"] == "kv_transfer_params.remote_block_media"
        r = c.post("/v1/completions", json={**BODY, "kv_transfer_params": {
            "do_remote_prefill": True, "remote_url": holder.http.url, "remote_block_ids": [1],
            "remote_block_media": ["DISK"]}})
        assert r.status_code == 400 and "remote_block_media" in r.json()["error"]["message"]
