"""A request the router's queue holds for its busy replica holds back only that replica's requests
(``admission.lookahead``): one routed to an idle replica behind it goes at once. Strictly in order (``lookahead=1``),
the idle replica waits with it: head-of-line blocking, which on long prompts (a wait above ``admit_ttft_s`` behind
any prefill) queued every request of a fleet behind whichever replica was busiest. The held request waits for its
replica here (``hold_while_idle`` on; off, it would not wait while another replica is idle:
test_admission_while_idle.py)."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from kvmesh.router.admission.config import AdmissionConfig

from .conftest import wait_for

HOLDER_PROMPT = "Once upon a time there was a little girl who loved to play in the park with her red ball. " * 6
OTHER_PROMPT = "The old sailor counted the stars above the harbour while the gulls slept on the wet rope. " * 6
DELAY_S = 4.0
RATE = 1.0
"""Prompt tokens per second the replicas report: a prompt queued there is seconds of wait, beyond
``admit_ttft_s``."""


@pytest.fixture
def busy_router(fakes, start_router, request):
    for fake in fakes:
        fake.configure(delay=DELAY_S, prefill_tokens_per_s=RATE)
    try:
        router = start_router([f.spec for f in fakes],
                              admission=AdmissionConfig(lookahead=request.param, hold_while_idle=True))
        loads = router.runtime.router.loads.loads
        wait_for(lambda: len(loads) == 2 and all(load.prefill_tokens_per_s for load in loads.values()),
                 what="both replicas' prefill rates")
        yield router
    finally:
        for fake in fakes:
            fake.configure(prefill_tokens_per_s=0.0)


def _post(router, prompt: str) -> threading.Thread:
    thread = threading.Thread(target=httpx.post, args=(router.url + "/v1/completions",),
                              kwargs={"json": {"prompt": prompt, "max_tokens": 2}, "timeout": 30}, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("busy_router", [AdmissionConfig().lookahead, 1], indirect=True,
                         ids=["lookahead", "strictly_in_order"])
def test_a_request_for_an_idle_replica_passes_one_waiting_for_a_busy_one(busy_router):
    queue = lambda: busy_router.runtime.admission.admission.queues.get("") or ()  # noqa: E731
    loads = busy_router.runtime.router.loads.loads
    in_flight = lambda: sorted(load.in_flight for load in loads.values())  # noqa: E731
    threads = [_post(busy_router, HOLDER_PROMPT)]
    wait_for(lambda: in_flight() == [0, 1], timeout=5, what="the first request on its replica")
    threads.append(_post(busy_router, HOLDER_PROMPT))  # its prefix is there: it waits for that replica
    wait_for(lambda: len(queue()) == 1, timeout=5, what="the second request waiting in the router")
    threads.append(_post(busy_router, OTHER_PROMPT))  # nothing of it anywhere: the idle replica is its best
    if busy_router.config.admission.lookahead > 1:
        wait_for(lambda: in_flight() == [1, 1] and len(queue()) == 1, timeout=DELAY_S / 2,
                 what="the third request on the idle replica while the second still waits for the busy one")
    else:
        time.sleep(DELAY_S / 2)
        assert (len(queue()), in_flight()) == (2, [0, 1])  # the idle replica waits behind the busy one's request
    for thread in threads:
        thread.join(30)
