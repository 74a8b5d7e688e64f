"""Grammar compile seconds count in the tenant's fair share (router/http/compile_charge.py): priced as the prompt
tokens the replica would have computed in them, so a tenant whose requests cost compiles is served after a light
one."""

from __future__ import annotations

import pytest
from kvmesh.router.admission.config import AdmissionConfig
from kvmesh.router.admission.decisions import Admission
from kvmesh.router.admission.ledger import LocalLedger
from kvmesh.router.admission.queue import AdmissionQueue, Waiter
from kvmesh.router.http.compile_charge import MAX_COMPILE_S, compile_tokens
from kvmesh.router.replicas.load import ReplicaLoad

HEADER = "x-kvmesh-grammar-compile-s"


def _loads(**rates) -> dict:
    return {rid: ReplicaLoad(prefill_tokens_per_s=rate) for rid, rate in rates.items()}


def test_seconds_are_priced_at_the_replicas_prefill_rate():
    loads = _loads(a=1000.0, b=250.0, c=None)
    assert compile_tokens({HEADER: "2.5"}, "a", loads) == pytest.approx(2500.0)
    assert compile_tokens({HEADER: "2.5"}, "c", loads) == pytest.approx(625.0)  # not measured: the slowest rate
    assert compile_tokens({HEADER: "1e9"}, "a", loads) == pytest.approx(MAX_COMPILE_S * 1000.0)
    assert compile_tokens({}, "a", loads) == 0.0


@pytest.mark.parametrize("value", ["nan", "inf", "-3", "0", "soon", "1" * 100])
def test_a_nonsense_value_charges_nothing(value):
    assert compile_tokens({HEADER: value}, "a", _loads(a=1000.0)) == 0.0


def test_no_rate_measured_anywhere_charges_nothing():
    assert compile_tokens({HEADER: "3"}, "a", _loads(a=None)) == 0.0


def test_a_tenant_whose_requests_cost_compiles_goes_after_a_light_one():
    config = AdmissionConfig()
    adm = Admission(config, LocalLedger(config.fair_share_half_life_s))
    heavy, light = Waiter("m", "heavy", 0, 0.0, None, 10), Waiter("m", "light", 0, 0.0, None, 10)
    for waiter in (heavy, light):  # the same requests, the same output
        adm.finished(waiter, 20, now=1.0)
    adm.charge_compile(heavy, compile_tokens({HEADER: "0.5"}, "a", _loads(a=1000.0)), now=1.0)
    assert adm.ledger.usage("heavy", 1.0) == pytest.approx(adm.ledger.usage("light", 1.0) + 500.0)
    queue = AdmissionQueue()
    next_heavy, next_light = Waiter("m", "heavy", 0, 2.0, None, 10), Waiter("m", "light", 0, 2.0, None, 10)
    queue.push(next_heavy)  # first to arrive
    queue.push(next_light)
    assert queue.head(lambda tenant: adm.ledger.usage(tenant, 2.0)) is next_light
