"""Whose a request is (router/admission/tenants.py): the credentials name the tenant, never the body's ``user``;
the router's own key is a tenant of its own; ``user`` names only sub-tenants of the key, when the operator says so,
capped per key; every caller's priority is clamped; priorities stay inside one documented range."""

from __future__ import annotations

import msgspec
import pytest
from kvmesh.replica.openai import protocol, sampling_fields
from kvmesh.replica.openai.body import parse_body
from kvmesh.replica.serving.errors import ProtocolError
from kvmesh.router.admission.config import AdmissionConfig
from kvmesh.router.admission.rate_limit import TokenRate
from kvmesh.router.admission.tenants import OTHER_USERS, PRIORITY_LIMIT, KeyEntry, Tenants

LIGHT, BATCH = "sk-light-0123456789", "sk-batch-0123456789"


def _tenants(**kw) -> Tenants:
    return Tenants([KeyEntry(LIGHT, "light", tokens_per_s=10.0), KeyEntry(BATCH, "batch", 10, 10)],
                   default_limit=TokenRate(5, 50), **kw)


def test_the_shared_key_is_one_tenant_whatever_user_it_names():
    tenants = _tenants()
    for user in (None, "light", "vip", "batch"):
        shared = tenants.resolve("the-routers-own-key", user)
        assert (shared.name, shared.priority, shared.min_priority) == ("default", 0, 0)
    assert tenants.resolve(None, "light").name == "default"  # no key at all (an open router): the same tenant


def test_a_key_names_its_tenant_and_user_never_changes_it():
    tenants = _tenants()
    assert tenants.resolve(LIGHT, "batch").name == "light"
    assert tenants.resolve(BATCH, "light").name == "batch"


def test_the_shared_tenant_is_configurable_and_clamped_like_any_other():
    tenants = AdmissionConfig(shared_tenant="public", shared_priority=5, shared_min_priority=2).tenants()
    shared = tenants.resolve("anything", "vip")
    assert shared.name == "public"
    assert shared.grant(None) == 5 and shared.grant(-1_000_000) == 2 and shared.grant(7) == 7
    assert AdmissionConfig().tenants().resolve(None, None).grant(-5) == 0  # by default no better than 0


def test_a_keys_priority_floor_holds_whatever_is_asked():
    batch = _tenants().resolve(BATCH, None)
    assert batch.grant(None) == 10 and batch.grant(-1000) == 10 and batch.grant(20) == 20


def test_user_sub_tenants_only_when_turned_on_namespaced_and_capped_per_key():
    off = _tenants()
    assert off.resolve(LIGHT, "alice").name == "light"
    on = _tenants(users_per_key=2)
    alice = on.resolve(LIGHT, "alice")
    assert (alice.name, alice.limit, alice.min_priority) == ("light/alice", TokenRate(10.0, 100.0), 0)
    assert on.resolve(BATCH, "alice").name == "batch/alice" and on.resolve(BATCH, "alice").grant(-5) == 10
    assert on.resolve("shared", "light").name == "default/light"  # never the keyed tenant light
    assert on.resolve(LIGHT, "bob").name == "light/bob"
    assert [on.resolve(LIGHT, u).name for u in ("carol", "dave", "alice")] == \
        [f"light/{OTHER_USERS}", f"light/{OTHER_USERS}", "light/alice"]  # past the cap: one shared bucket
    assert on.resolve(LIGHT, "x" * 10_000).name == f"light/{OTHER_USERS}"
    assert on.resolve(LIGHT, None).name == "light"


def test_keys_file_tenants_cannot_take_the_shared_or_a_sub_tenants_name():
    with pytest.raises(ValueError, match="shared"):
        Tenants([KeyEntry(LIGHT, "default")])
    with pytest.raises(ValueError, match="/"):
        Tenants([KeyEntry(LIGHT, "light/alice")])
    with pytest.raises(ValueError, match="priority"):
        Tenants([KeyEntry(LIGHT, "light", priority=2**40)])


def test_config_refuses_a_shared_floor_worse_than_its_default():
    with pytest.raises(ValueError, match="shared_min_priority"):
        AdmissionConfig(shared_priority=0, shared_min_priority=3)
    with pytest.raises(ValueError, match="max_users_per_key"):
        AdmissionConfig(user_tenants=True, max_users_per_key=0)


def test_priority_outside_the_range_is_a_400_naming_the_field():
    assert PRIORITY_LIMIT == sampling_fields.PRIORITY_LIMIT  # the router's bound is the OpenAI layer's
    for value in (PRIORITY_LIMIT + 1, -PRIORITY_LIMIT - 1, -10**28, 10**100):
        with pytest.raises(ProtocolError, match="priority") as e:
            parse_body(msgspec.json.encode({"prompt": "x", "priority": value}), protocol.CompletionRequest)
        assert e.value.status_code == 400
    assert protocol.CompletionRequest(prompt="x", priority=-PRIORITY_LIMIT).priority == -PRIORITY_LIMIT


def test_a_router_only_replica_takes_the_internal_key_alone():
    from kvmesh.replica.openai.auth import AuthMiddleware

    auth = AuthMiddleware(None, api_key="tenant-key-1", internal_key="internal-key-1", router_only=True)
    assert auth.refusal("POST", "/v1/completions", b"Bearer internal-key-1") is None
    assert auth.refusal("GET", "/load", b"") is None  # the public paths stay open
    tenant = auth.refusal("POST", "/v1/completions", b"Bearer tenant-key-1")
    assert tenant.status_code == 403 and "router" in tenant.message
    assert auth.refusal("POST", "/v1/chat/completions", b"").status_code == 401
    standalone = AuthMiddleware(None, api_key="tenant-key-1", internal_key="internal-key-1")
    assert standalone.refusal("POST", "/v1/completions", b"Bearer tenant-key-1") is None  # its own key's rule


def test_a_keys_rate_limit_bounds_the_whole_key_whatever_user_each_request_names():
    """17 ``user`` names under one key get the key's bucket once between them, not 17 times (each keeps its fair
    share of the queue: ``user`` splits the share, never the limit)."""
    from kvmesh.router.admission.decisions import OVER_LIMIT, Admission, Shed
    from kvmesh.router.admission.ledger import LocalLedger
    from kvmesh.router.admission.queue import Waiter

    tenants = Tenants([KeyEntry(LIGHT, "light", tokens_per_s=10.0, burst_tokens=100.0)], users_per_key=16)
    config = AdmissionConfig(max_queued=1000)
    adm = Admission(config, LocalLedger(config.fair_share_half_life_s))
    answers = [adm.arrive("m", tenants.resolve(LIGHT, f"user-{i}"), 0, 60, None, now=0.0) for i in range(17)]
    assert isinstance(answers[0], Waiter) and answers[0].tenant == "light/user-0"
    shed = [a for a in answers[1:] if isinstance(a, Shed)]
    assert len(shed) == 16 and {a.reason for a in shed} == {OVER_LIMIT}, answers
    assert "'light' over limit" in shed[0].message  # the key's tenant is what is over
    adm.finished(answers[0], 40, now=0.0)  # its output comes out of the key's bucket too: 100 - 60 - 40 = 0
    assert adm.ledger.try_take("light", 10, tenants.resolve(LIGHT, None).limit, now=0.0) == pytest.approx(1.0)
    assert adm.ledger.usage("light/user-0", 0.0) > 0  # the fair share stays the sub-tenant's own
