"""The router learns the queue's tail (``cache_aware_tokens``' ``tail_knee``) from the streams it answers, each against
its priority class's TTFT deadline (``admission.ttft_deadline_s``, set by the operator) or the router's
``admission.ttft_target_s``; a deadline the client writes in ``x-kvmesh-ttft-deadline-ms`` is not a target (a tenant
could otherwise lift the load weight for everyone by asking for a tiny one)."""

from __future__ import annotations

import httpx
import pytest
from kvmesh.router.admission.config import AdmissionConfig

from .conftest import wait_for

PROMPT = "Once upon a time there was a little girl who loved to play in the park with her red ball. "
DELAY_S = 0.3
"""Seconds a fake replica takes to its first bytes; it reports a prefill rate so fast that all of it is a wait."""


@pytest.fixture
def router(fakes, start_router):
    for fake in fakes:
        fake.configure(delay=DELAY_S, prefill_tokens_per_s=1e9)
    server = start_router([f.spec for f in fakes], policy_kwargs={"tail_knee": 0.1, "tail_window": 4},
                          admission=AdmissionConfig(ttft_deadline_s={0: 0.35, 10: 100.0}, ttft_target_s=100.0))
    loads = server.runtime.router.loads.loads
    wait_for(lambda: len(loads) == 2 and all(load.prefill_tokens_per_s for load in loads.values()),
             what="both replicas' prefill rates")
    yield server
    for fake in fakes:
        fake.configure(delay=0.0, prefill_tokens_per_s=0.0)


def _streams(router, n: int, tag: str, headers: dict[str, str]) -> None:
    for i in range(n):
        with httpx.stream("POST", router.url + "/v1/completions", timeout=30, headers=headers,
                          json={"prompt": f"{tag} {i} {PROMPT}", "max_tokens": 2, "stream": True}) as r:
            assert r.status_code == 200, r.read()
            r.read()


def test_waits_count_against_the_priority_class_deadline_never_the_clients(router):
    tail = router.runtime.router.policy.tail
    _streams(router, 4, "relaxed", {"x-kvmesh-priority": "10"})  # a 0.3 s wait of a 100 s deadline
    wait_for(lambda: len(tail.ratios) == 4, what="four waits learned")
    assert tail.tail < 0.05 and tail.lift == 0.0
    # as a target its 0.5 s would read a 0.3 s wait as 0.6 of it, far past the knee
    _streams(router, 4, "liar", {"x-kvmesh-priority": "10", "x-kvmesh-ttft-deadline-ms": "500"})
    wait_for(lambda: len(tail.ratios) == 4 and tail.tail < 0.05, what="the liar's waits against its class's 100 s")
    assert tail.lift == 0.0
    _streams(router, 4, "urgent", {"x-kvmesh-priority": "0"})  # the same wait, most of a 0.35 s deadline
    wait_for(lambda: tail.lift > 0.5, what="the load weight lifted")
    assert tail.tail > 0.6
    text = httpx.get(router.url + "/metrics").text  # what an operator sees of it
    assert f"kvmesh_router_queue_tail_lift {tail.lift}" in text and f"kvmesh_router_queue_tail {tail.tail}" in text
