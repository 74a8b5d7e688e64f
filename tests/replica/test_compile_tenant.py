"""Whose turn a grammar compile takes (replica/openai/compile_tenant.py, engine/grammar_pool.py): the tenant the
router named, whatever ``user`` the request carries; ``user`` only when no router said; the header honoured only
from the cluster's internal key."""

from __future__ import annotations

import pytest
from kvmesh.replica.openai.auth import INTERNAL_SCOPE_KEY
from kvmesh.replica.openai.compile_tenant import TENANT_HEADER, charge_compiles, compile_tenant, tenant_header
from kvmesh.replica.openai.protocol import CompletionRequest
from kvmesh.replica.serving.errors import ProtocolError
from kvmesh.replica.serving.structured_outputs import StructuredOutputsParams
from starlette.requests import Request

from .test_grammar_pool import pool  # noqa: F401  (the fixture)

INTERNAL_KEY = "internal-0123456789"


def _http(headers: dict[str, str], internal: bool) -> Request:
    raw = [(k.lower().encode(), v.encode("latin-1")) for k, v in headers.items()]
    return Request({"type": "http", "method": "POST", "path": "/v1/completions", "headers": raw,
                    "state": {INTERNAL_SCOPE_KEY: internal}})


def _constraint(user: str, i: int, router_tenant: str | None, internal: bool = True) -> StructuredOutputsParams:
    """A structured request's constraint as the replica builds it, from a caller holding the internal key or not,
    with the router's tenant header or none."""
    req = CompletionRequest(prompt="Once upon a time", max_tokens=2, user=user,
                            structured_outputs={"choice": [f"{user}-{i}", "x"]})
    headers = {} if router_tenant is None else tenant_header(router_tenant)
    charge_compiles(req, compile_tenant(_http(headers, internal), INTERNAL_KEY))
    constraint = req.to_sampling_params(4, 64).structured_outputs
    assert constraint is not None
    return constraint


def test_many_user_names_under_one_key_get_one_tenants_turns(pool):  # noqa: F811
    """A heavy tenant queues six compiles under six ``user`` names, then a light tenant one: through the router,
    the light one is the second to compile, not the seventh."""
    p, order, futures = pool(compile_processes=1), [], []
    jobs = [_constraint(f"puppet{i}", i, "heavy") for i in range(6)] + [_constraint("light-user", 0, "light")]
    for so in jobs:
        future = p.submit(so.key, so, so.tenant, so.choice[0])
        future.add_done_callback(lambda f, name=so.choice[0]: order.append(name))  # on the dispatcher thread
        futures.append(future)
    for future in futures:
        assert future.exception(timeout=120) is None
    assert [so.tenant for so in jobs] == ["heavy"] * 6 + ["light"]
    assert order[:3] == ["puppet0-0", "light-user-0", "puppet1-1"], order


def test_without_a_router_the_turns_go_by_user():
    assert _constraint("alice", 0, None).tenant == "alice"
    assert _constraint("alice", 0, None, internal=False).tenant == "alice"


@pytest.mark.parametrize("name", ["team/a b", "ünïcode", "x" * 200])
def test_the_routers_tenant_survives_the_header(name):
    assert _constraint("someone", 0, name).tenant == name


def test_a_caller_without_the_internal_key_may_not_name_the_tenant():
    with pytest.raises(ProtocolError) as refused:
        _constraint("puppet", 0, "light", internal=False)
    assert refused.value.status_code == 403 and refused.value.param == TENANT_HEADER
    assert "only by the router" in str(refused.value)


def test_a_replica_without_an_internal_key_trusts_its_caller_and_an_empty_name_is_a_400():
    assert compile_tenant(_http(tenant_header("light"), internal=False), None) == "light"
    with pytest.raises(ProtocolError) as refused:
        compile_tenant(_http({TENANT_HEADER: ""}, internal=True), INTERNAL_KEY)
    assert refused.value.status_code == 400 and refused.value.param == TENANT_HEADER
