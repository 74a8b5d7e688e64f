"""Grammar compile seconds count in the tenant's fair share (router/http/compile_charge.py): priced as the prompt
tokens the replica would have computed in them, so a tenant whose requests cost compiles is served after a light
one."""

from __future__ import annotations

import time

import httpx
import pytest
from kvmesh.router.admission.config import AdmissionConfig
from kvmesh.router.admission.decisions import Admission
from kvmesh.router.admission.ledger import LocalLedger
from kvmesh.router.admission.queue import AdmissionQueue, Waiter
from kvmesh.router.http.compile_charge import MAX_COMPILE_S, compile_tokens
from kvmesh.router.replicas.load import ReplicaLoad
from kvmesh.router.replicas.replica import Replica

from .conftest import wait_for

HEADER = "x-kvmesh-grammar-compile-s"


def _loads(**rates) -> dict[str, Replica]:
    """Replicas by name, each with its measured prefill rate (None: not measured)."""
    return {rid: Replica(rid, load=ReplicaLoad(prefill_tokens_per_s=rate)) for rid, rate in rates.items()}


def _tokens(headers: dict, name: str, fleet: dict[str, Replica]) -> float:
    return compile_tokens(headers, fleet[name], fleet.values())


def test_seconds_are_priced_at_the_replicas_prefill_rate():
    loads = _loads(a=1000.0, b=250.0, c=None)
    assert _tokens({HEADER: "2.5"}, "a", loads) == pytest.approx(2500.0)
    assert _tokens({HEADER: "2.5"}, "c", loads) == pytest.approx(625.0)  # not measured: the slowest rate
    assert _tokens({HEADER: "1e9"}, "a", loads) == pytest.approx(MAX_COMPILE_S * 1000.0)
    assert _tokens({}, "a", loads) == 0.0


@pytest.mark.parametrize("value", ["nan", "inf", "-3", "0", "soon", "1" * 100])
def test_a_nonsense_value_charges_nothing(value):
    assert _tokens({HEADER: value}, "a", _loads(a=1000.0)) == 0.0


def test_no_rate_measured_anywhere_charges_nothing():
    assert _tokens({HEADER: "3"}, "a", _loads(a=None)) == 0.0


def test_a_tenant_whose_requests_cost_compiles_goes_after_a_light_one():
    config = AdmissionConfig()
    adm = Admission(config, LocalLedger(config.fair_share_half_life_s))
    heavy, light = Waiter("m", "heavy", 0, 0.0, None, 10), Waiter("m", "light", 0, 0.0, None, 10)
    for waiter in (heavy, light):  # the same requests, the same output
        adm.finished(waiter, 20, now=1.0)
    adm.charge_compile(heavy, _tokens({HEADER: "0.5"}, "a", _loads(a=1000.0)), now=1.0)
    assert adm.ledger.usage("heavy", 1.0) == pytest.approx(adm.ledger.usage("light", 1.0) + 500.0)
    queue = AdmissionQueue()
    next_heavy, next_light = Waiter("m", "heavy", 0, 2.0, None, 10), Waiter("m", "light", 0, 2.0, None, 10)
    queue.push(next_heavy)  # first to arrive
    queue.push(next_light)
    assert queue.head(lambda tenant: adm.ledger.usage(tenant, 2.0)) is next_light


@pytest.mark.parametrize("stream", [False, True])
def test_through_the_router_the_reported_seconds_land_in_the_tenants_usage(fakes, start_router, tmp_path, stream):
    """A replica reporting 0.5 s of compile at 1,000 prompt tokens/s: the structured request's tenant ends 500
    weighted tokens above a tenant sending the same request without a grammar."""
    keys = {"heavy": "sk-heavy-0123456789", "light": "sk-light-0123456789"}
    path = tmp_path / "keys.yaml"
    path.write_text("keys:\n" + "".join(f"  - {{key: {key}, tenant: {name}}}\n" for name, key in keys.items()))
    fake = fakes[0]
    fake.configure(grammar_compile_s=0.5, prefill_tokens_per_s=1000.0)
    try:
        router = start_router([fake.spec], admission=AdmissionConfig(keys_file=str(path)))
        wait_for(lambda: router.runtime.router.loads.loads.get("a") is not None
                 and router.runtime.router.loads.loads["a"].prefill_tokens_per_s, what="the replica's prefill rate")
        body = {"prompt": "Once upon a time", "max_tokens": 2, "stream": stream}
        for tenant, extra in (("heavy", {"structured_outputs": {"choice": ["yes", "no"]}}), ("light", {})):
            r = httpx.post(router.url + "/v1/completions", json={**body, **extra}, timeout=30,
                           headers={"Authorization": f"Bearer {keys[tenant]}"})
            assert r.status_code == 200, r.text
        ledger, now = router.runtime.admission.admission.ledger, time.monotonic()
        heavy, light = ledger.usage("heavy", now), ledger.usage("light", now)
        assert heavy - light == pytest.approx(500.0, rel=0.01), (heavy, light)
    finally:
        fake.configure(grammar_compile_s=0.0, prefill_tokens_per_s=0.0)
