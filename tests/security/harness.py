"""What the security tests do to a live cluster: its parts by role, the credentials, raw bodies, readings.

``KVCluster`` wraps a started ``kvmesh serve`` (tests/cluster/live_cluster.py) of one prefill and one decode
replica, both with KV transfer on (the P/D split; their /kv routes and ``kv_transfer_params`` are the peer pulls'
too). The tenant-facing router is what an attacker reaches; the replicas' own URLs and the cluster's keys come
from the ``ServeCluster`` object (what only the cluster and the test know), never from the router.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass

import httpx
from kvmesh.cluster.launch.launcher import ServeCluster

from . import names
from .metrics import replica_sample

DECODE, PREFILL = "replica-0", "prefill-1"
"""The replica ids of the harness's cluster."""
BLOCK = 16
"""The engine's block size (EngineConfig's default)."""
STORY = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her "
         "friends. One day, she saw a big red ball under a tree. She ran to the ball and picked it up. Her mom "
         "said, you can keep the ball if you share it. Lily was happy and said thank you. Then a small dog came "
         "and wanted to play too. Lily threw the ball and the dog ran after it, and they played until the sun "
         "went down. ")
OTHER_STORY = ("Tom had a blue boat. Every morning he took it to the lake and watched the fish jump. A frog sat "
               "on a green leaf and sang a song about the rain. The boat went round and round until Tom was "
               "tired, then he ate an apple and went to sleep under the big old tree by the water. ")


@dataclass
class KVCluster:
    """A started cluster and what the tests know of it (see the module doc)."""

    serve: ServeCluster
    api_key: str | None
    """The tenants' key (None: the router takes requests without one)."""

    @property
    def url(self) -> str:
        return self.serve.url

    @property
    def model(self) -> str:
        return self.serve.state.served_model_name

    def replica_url(self, replica_id: str) -> str:
        return next(h.endpoints["http_url"] for h in self.serve.state.replicas if h.replica_id == replica_id)

    def tenant(self) -> dict[str, str]:
        """A tenant's headers: its API key when the router has one."""
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def admin(self) -> dict[str, str]:
        """The operator's admin key, from the key file serve wrote."""
        return {"Authorization": f"Bearer {json.loads(self.serve.admin_key_file.read_text())['admin_key']}"}

    def cluster_key(self) -> dict[str, str]:
        """What the router sends its replicas, the cluster's internal key: the test's own way onto the KV plane,
        to set a scene up and read it."""
        return {"Authorization": f"Bearer {names.internal_key(self.serve)}"}

    def as_peer(self, peer_id: str) -> dict[str, str]:
        """The cluster's key plus the puller's name: a registered peer's /kv/* call."""
        return {**self.cluster_key(), names.REPLICA_ID_HEADER: peer_id}

    # ------------------------------------------------------------ requests
    def completion_body(self, prompt: list[int], max_tokens: int = 16, salt: str | None = None,
                        **extra: object) -> dict:
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                "ignore_eos": True, **extra}
        if salt is not None:
            body["cache_salt"] = salt
        return body

    def via_router(self, raw: bytes | dict, path: str = "/v1/completions", timeout: float = 60,
                   headers: dict | None = None) -> httpx.Response:
        """A tenant's request through the router (``raw`` bytes go as they are: spellings matter), receipt on."""
        content = raw if isinstance(raw, bytes) else json.dumps(raw).encode()
        return httpx.post(self.url + path, content=content, timeout=timeout,
                          headers={"content-type": "application/json", "x-kvmesh-receipt": "1",
                                   **(self.tenant() if headers is None else headers)})

    def direct(self, replica_id: str, body: dict, timeout: float = 60) -> httpx.Response:
        """A completion straight to a replica with the cluster's key (setting a scene up, as the router would)."""
        r = httpx.post(self.replica_url(replica_id) + "/v1/completions", json=body, headers=self.cluster_key(),
                       timeout=timeout)
        assert r.status_code == 200, r.text
        return r

    def hold(self, replica_id: str, prompt: list[int], salt: str | None) -> list[int]:
        """Make ``replica_id`` hold ``prompt``'s blocks (a request computed there) and return their block ids
        there (a lease the test takes and releases at once)."""
        self.direct(replica_id, self.completion_body(prompt, 1, salt))
        lease = self.lease(replica_id, prompt, salt)
        assert lease.status_code == 200, lease.text
        answer = lease.json()
        self.release(replica_id, answer["lease_id"])
        assert len(answer["remote_block_ids"]) == len(prompt) // BLOCK, answer
        return answer["remote_block_ids"]

    def lease(self, replica_id: str, prompt: list[int], salt: str | None = None, ttl_s: float | None = None,
              headers: dict | None = None) -> httpx.Response:
        body: dict = {"prompt_token_ids": prompt, "cache_salt": salt}
        if ttl_s is not None:
            body["ttl_s"] = ttl_s
        peer = DECODE if replica_id == PREFILL else PREFILL
        return httpx.post(self.replica_url(replica_id) + "/kv/lease", json=body, timeout=30,
                          headers=self.as_peer(peer) if headers is None else headers)

    def release(self, replica_id: str, lease_id: str, headers: dict | None = None) -> httpx.Response:
        peer = DECODE if replica_id == PREFILL else PREFILL
        return httpx.post(self.replica_url(replica_id) + "/kv/release", json={"lease_id": lease_id}, timeout=30,
                          headers=self.as_peer(peer) if headers is None else headers)

    # ------------------------------------------------------------ readings
    def leases_active(self, replica_id: str) -> int:
        return int(replica_sample(self.replica_url(replica_id), names.LEASES_ACTIVE))

    def pulls(self, replica_id: str) -> int:
        """Pulls a replica tried, whatever their outcome."""
        return int(replica_sample(self.replica_url(replica_id), names.PULLS_TOTAL, total=True))

    def effects(self) -> dict[str, int]:
        """Leases held and pulls tried, per replica: what a refused attack must leave unchanged."""
        out = {}
        for rid in (DECODE, PREFILL):
            out[f"{rid} leases"] = self.leases_active(rid)
            out[f"{rid} pulls"] = self.pulls(rid)
        return out


def unseen_text(tokenizer, tokens: int, text: str = STORY, bos: bool = True) -> list[int]:
    """``tokens`` token ids of a story no replica has seen (a fresh id leads it); BOS first unless ``bos`` is
    False (a piece to append)."""
    ids = tokenizer(f"Story {uuid.uuid4().hex}. " + text * (1 + tokens // 40))["input_ids"]
    ids = ids if bos else ids[1:]
    assert len(ids) >= tokens
    return ids[:tokens]


def pulled_tokens(response: httpx.Response) -> int:
    return int(response.headers.get(names.PULLED_TOKENS_HEADER, "0"))


def is_refusal(response: httpx.Response) -> bool:
    """A 4xx with an OpenAI-shaped error body."""
    if not 400 <= response.status_code < 500:
        return False
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return isinstance(error, dict) and isinstance(error.get("message"), str) and "type" in error


def timed(fn, *args, **kwargs) -> tuple[float, object]:
    """(seconds, result or the exception raised)."""
    t0 = time.monotonic()
    try:
        result = fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - a timeout is a measurement here
        result = e
    return time.monotonic() - t0, result
