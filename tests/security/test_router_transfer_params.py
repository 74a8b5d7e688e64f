"""Attacks through the router with ``kv_transfer_params`` spelled with a JSON escape.

The router once refused the field by a byte search for ``"kv_transfer_params"``; ``"kv_transfer\\u005fparams"``
decodes to the same key, so the body passed and the replica acted on it. Each test replays one attack
through the router, with and without the router's ``api_key`` (the ``kv_cluster`` parameter), and asserts
the safe outcome: an OpenAI-shaped 4xx and no effect (no pull, no lease, no call out, no foreign block).

    (a) read another tenant's salted blocks by block id: the victim's greedy continuation comes back
    (b) plant foreign KV under a popular unsalted prompt: later senders get the planted text
    (c) make a replica call a URL of the tenant's choosing with the cluster's key
    (d) pin the decode replica's pool with leases: another tenant's request waits
"""

from __future__ import annotations

import json
import uuid

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from . import names
from .harness import (
    BLOCK,
    DECODE,
    OTHER_STORY,
    PREFILL,
    STORY,
    KVCluster,
    is_refusal,
    pulled_tokens,
    timed,
    unseen_text,
)

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ESCAPED_FIELD = "kv_transfer\\u005fparams"
"""``kv_transfer_params`` with its underscore as a JSON escape (the spelling that passed the byte search)."""
SHARED_BLOCKS, SECRET_BLOCKS, TAIL = 16, 4, 5
"""A victim's prompt: a public prefix (16 blocks) the attacker also sends, a secret (4 blocks), a tail."""


def with_field(body: dict, params: dict, field: str = ESCAPED_FIELD) -> bytes:
    """``body`` as JSON with ``params`` under the key spelled ``field`` (as raw bytes: the spelling matters)."""
    return json.dumps(body)[:-1].encode() + f', "{field}": {json.dumps(params)}}}'.encode()


def refused_without_effect(cluster: KVCluster, response: httpx.Response, before: dict[str, int]) -> None:
    assert is_refusal(response), (f"the router let a client's kv_transfer_params through: HTTP "
                                  f"{response.status_code} {response.text[:300]}")
    assert pulled_tokens(response) == 0, dict(response.headers)
    assert cluster.effects() == before, "a refused request changed the replicas' leases or pulls"


def warm_public_prefix(cluster: KVCluster, shared: list[int]) -> None:
    """The public prefix cached on the decode replica without a salt (anyone's earlier request)."""
    r = cluster.via_router(cluster.completion_body(shared + [13], 1))
    assert r.status_code == 200, r.text
    cluster.direct(DECODE, cluster.completion_body(shared + [13], 1))  # split or not: the decode replica has it


def test_a_tenant_cannot_read_another_tenants_salted_blocks_by_id(kv_cluster, tokenizer, reference, record):
    c = kv_cluster
    shared = unseen_text(tokenizer, SHARED_BLOCKS * BLOCK)
    secret = unseen_text(tokenizer, SECRET_BLOCKS * BLOCK, OTHER_STORY, bos=False)
    tail = tokenizer(" and then she said")["input_ids"][1:1 + TAIL]
    victim, salt = shared + secret + tail, f"victim-{uuid.uuid4().hex}"
    answer = c.via_router(c.completion_body(victim, salt=salt))
    assert answer.status_code == 200, answer.text
    victim_text = answer.json()["choices"][0]["text"]
    victim_blocks = c.hold(PREFILL, victim, salt)  # the holder keeps the victim's blocks (the split's prefill)
    warm_public_prefix(c, shared)

    for _ in range(5):  # the attacker's own tokens, whose own text is not the victim's (else nothing is shown)
        attack = shared + unseen_text(tokenizer, SECRET_BLOCKS * BLOCK, STORY, bos=False) + tail
        if reference(attack) != victim_text:
            break
    else:
        pytest.fail("five attackers' prompts gave the victim's text on their own: pick another tail")
    before = c.effects()
    params = {"do_remote_prefill": True, "remote_url": c.replica_url(PREFILL), "remote_block_ids": victim_blocks}
    response = c.via_router(with_field(c.completion_body(attack), params))
    text = response.json()["choices"][0]["text"] if response.status_code == 200 else None
    record("a: read a salted victim's blocks by id", status=response.status_code, pulled=pulled_tokens(response),
           victim_text_read_back=text == victim_text, victim_text=victim_text, attacker_text=text,
           effects_before=before, effects_after=c.effects())
    assert text != victim_text, "the attacker read the victim's continuation back"
    refused_without_effect(c, response, before)


def test_a_tenant_cannot_plant_kv_under_a_popular_prompt(kv_cluster, tokenizer, reference, record):
    c = kv_cluster
    shared = unseen_text(tokenizer, SHARED_BLOCKS * BLOCK)
    question = unseen_text(tokenizer, SECRET_BLOCKS * BLOCK, STORY, bos=False)
    tail = tokenizer(" and then they")["input_ids"][1:1 + TAIL]
    popular = shared + question + tail  # unsalted: everyone who sends it shares its blocks
    evil = shared + unseen_text(tokenizer, SECRET_BLOCKS * BLOCK, OTHER_STORY, bos=False) + tail
    evil_blocks = c.hold(PREFILL, evil, f"attacker-{uuid.uuid4().hex}")  # the attacker's own, on a holder
    warm_public_prefix(c, shared)

    before = c.effects()
    params = {"do_remote_prefill": True, "remote_url": c.replica_url(PREFILL), "remote_block_ids": evil_blocks}
    response = c.via_router(with_field(c.completion_body(popular, max_tokens=1), params))
    after_attack = c.effects()
    later = c.via_router(c.completion_body(popular), headers=c.tenant())  # another tenant, later
    assert later.status_code == 200, later.text
    own = reference(popular)
    planted = later.json()["choices"][0]["text"]
    record("b: plant KV under a popular prompt", status=response.status_code, pulled=pulled_tokens(response),
           later_sender_got_planted_text=planted != own, later_text=planted, model_text=own,
           later_cached_tokens=later.json()["usage"]["prompt_tokens_details"]["cached_tokens"],
           later_replica=later.headers.get("x-kvmesh-replica"), effects_before=before, effects_after=after_attack)
    assert planted == own, "a later sender of the popular prompt got the planted KV's text"
    refused_without_effect(c, response, before)


def test_a_tenant_cannot_make_a_replica_call_its_url(kv_cluster, tokenizer, listener, record):
    c = kv_cluster
    before = c.effects()
    params = {"do_remote_prefill": True, "remote_url": listener.url}
    response = c.via_router(with_field(c.completion_body(unseen_text(tokenizer, 40), max_tokens=1), params))
    calls = list(listener.calls)
    keys = {call.authorization for call in calls}
    reused = {}
    for key in keys - {None}:  # what the carried key opens on the replica itself
        reused[key[:12] + "..."] = httpx.get(c.replica_url(DECODE) + "/kv/handshake", timeout=10,
                                             headers={"Authorization": key}).status_code
    record("c: make a replica call the tenant's URL", status=response.status_code,
           outbound_calls=[(call.method, call.path) for call in calls],
           carried_authorization=[k is not None for k in keys], carried_key_on_replica_handshake=reused)
    assert not calls, f"the replica called the tenant's URL: {calls}"
    refused_without_effect(c, response, before)


def test_a_tenant_cannot_pin_the_pool_with_leases(kv_cluster, tokenizer, record):
    c = kv_cluster
    normal, _ = timed(c.via_router, c.completion_body(unseen_text(tokenizer, 30 * BLOCK), max_tokens=4))
    before = c.effects()
    attacks, held = [], []
    free_blocks = (4 << 20) // (BLOCK * 1280)  # the pool (conftest.KV_POOL), about 200 blocks
    per_attack = 15  # under the split's 256 uncached tokens: the router sends it as it is
    try:
        for _ in range(free_blocks // per_attack - 1):
            body = with_field(c.completion_body(unseen_text(tokenizer, per_attack * BLOCK), max_tokens=1),
                              {"do_remote_decode": True})
            seconds, r = timed(c.via_router, body, timeout=names.NORMAL_WAIT_S)
            attacks.append(r.status_code if isinstance(r, httpx.Response) else type(r).__name__)
            if isinstance(r, httpx.Response) and r.status_code == 200:
                lease = (r.json().get("kv_transfer_params") or {}).get("remote_lease_id")
                if lease:
                    held.append(lease)
        pinned = c.leases_active(DECODE) - before[f"{DECODE} leases"]
        victim = c.completion_body(unseen_text(tokenizer, 30 * BLOCK), max_tokens=4)  # another tenant's
        wait, answer = timed(c.via_router, victim, timeout=names.NORMAL_WAIT_S + 1)
    finally:
        for lease in held:  # let the pool go again for the tests after this one
            c.release(DECODE, lease)
    record("d: pin the pool with leases", attack_statuses=attacks, leases_granted=len(held), leases_pinned=pinned,
           victim_wait_s=round(wait, 2), victim=getattr(answer, "status_code", type(answer).__name__),
           same_request_unpinned_s=round(normal, 2))
    assert not held and pinned == 0, f"{len(held)} leases granted to a tenant, {pinned} held on {DECODE}"
    assert all(isinstance(s, int) and 400 <= s < 500 for s in attacks), attacks
    assert isinstance(answer, httpx.Response) and answer.status_code == 200, answer
    assert wait < names.NORMAL_WAIT_S, f"another tenant's request waited {wait:.1f}s"


def test_the_clusters_own_split_still_moves_kv(kv_cluster, tokenizer, reference):
    """What the refusals above must leave working: the router's own P/D split of a long unseen prompt."""
    c = kv_cluster
    prompt = unseen_text(tokenizer, 20 * BLOCK + TAIL)
    r = c.via_router(c.completion_body(prompt))
    assert r.status_code == 200, r.text
    assert r.headers.get("x-kvmesh-prefill-replica") == PREFILL, (dict(r.headers), split_outcomes(c))
    assert pulled_tokens(r) >= 16 * BLOCK, dict(r.headers)
    assert r.json()["choices"][0]["text"] == reference(prompt)


def split_outcomes(cluster: KVCluster) -> dict[str, float]:
    """The router's ``kvmesh_router_pd_splits_total`` by outcome (why a split was not made)."""
    text = httpx.get(cluster.url + "/metrics", headers=cluster.admin(), timeout=10).text
    return {s.labels["outcome"]: s.value for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == "kvmesh_router_pd_splits_total"}
