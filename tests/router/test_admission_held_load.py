"""Requests the router's queue holds for a replica count in that replica's load while they wait.

Admission lets a request go to its replica only when its wait there is short; until then it waits in the router, and
a replica's load counts only what was let go. Without the held requests in it, every request routed meanwhile saw the
holder of a shared prefix as loaded as it was before the queue formed, chose it too and queued behind it unseen: on an
emulated fleet the router held most of a trace for two replicas while fourteen idled. Counted, the queue in front of
the holder costs what it will cost there, and a request goes elsewhere once recomputing its prompt is cheaper. The
router here holds requests while a replica is idle (``hold_while_idle``); by default it holds none then
(test_admission_while_idle.py), and the holds counted here are those of a fleet with no room.
"""

from __future__ import annotations

import threading

import httpx
import pytest
from kvmesh.router.admission.config import AdmissionConfig

from .conftest import wait_for

SHARED = list(range(1, 129))
"""The prompt prefix every request shares, as token ids (the fakes' cache and the router hash the same tokens)."""
TAILS = [list(range(130 + 40 * i, 170 + 40 * i)) for i in range(8)]
"""Each request's own tail after it."""
RATE = 1.0
"""Prompt tokens per second the replicas report: each tail queued on the holder is a minute of wait there."""
DELAY_S = 3.0
WHOLE_COPY = {"turnover_while_filling": False}
"""The default's cost with a copy priced whole on a filling fleet, so the idle holder is the first tail's choice
(with the default's first-copy discount it copies the prefix to the other replica at once, and nothing queues)."""


HOLDING = AdmissionConfig(hold_while_idle=True)
"""The router's queue holds a request for its busy replica although the other one is idle."""


def _post(router, prompt: list[int]) -> threading.Thread:
    thread = threading.Thread(target=httpx.post, args=(router.url + "/v1/completions",),
                              kwargs={"json": {"prompt": prompt, "max_tokens": 2}, "timeout": 60}, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def slow_fakes(fakes):
    for fake in fakes:
        fake.configure(prefill_tokens_per_s=RATE)
    yield fakes
    for fake in fakes:
        fake.configure(prefill_tokens_per_s=0.0)


def test_a_queue_held_for_the_holder_sends_the_later_requests_to_an_idle_replica(slow_fakes, start_router):
    router = start_router([f.spec for f in slow_fakes], policy_kwargs=WHOLE_COPY, admission=HOLDING)
    loads = router.runtime.router.loads.loads
    wait_for(lambda: len(loads) == 2 and all(load.prefill_tokens_per_s for load in loads.values()),
             what="both replicas' prefill rates")
    first = httpx.post(router.url + "/v1/completions", json={"prompt": SHARED, "max_tokens": 2}, timeout=30,
                       headers={"x-kvmesh-receipt": "1"})
    assert first.status_code == 200, first.text
    holder = first.headers["x-kvmesh-replica"]
    other = next(rid for rid in loads if rid != holder)
    wait_for(lambda: router.runtime.router.index.num_blocks(holder) > 0, what="the shared prefix in the index")
    for fake in slow_fakes:
        fake.configure(delay=DELAY_S)
    queue = lambda: router.runtime.admission.admission.queues.get("") or ()  # noqa: E731
    threads = [_post(router, SHARED + TAILS[0])]
    wait_for(lambda: loads[holder].in_flight == 1, timeout=5, what="the first tail on the holder")
    threads += [_post(router, SHARED + tail) for tail in TAILS[1:]]
    try:
        wait_for(lambda: len(queue()) + loads[holder].in_flight + loads[other].in_flight == len(TAILS), timeout=5,
                 what="every request queued or sent")
        wait_for(lambda: loads[other].in_flight > 0, timeout=DELAY_S / 2,
                 what=f"a request on the idle replica while {len(queue())} wait in the router for the holder")
    finally:
        for fake in slow_fakes:
            fake.configure(delay=0)
        for thread in threads:
            thread.join(60)
    assert all(load.held_prefill_tokens == load.held_requests == 0 for load in loads.values()), \
        "holds left in a replica's load after its queue emptied"


def test_waiters_that_leave_take_their_holds_with_them(slow_fakes, start_router):
    """Clients that give up while held (a tenant's retries with short timeouts) leave no load behind: a hold that
    outlived its waiter would keep the replica looking busy to every later request."""
    router = start_router([f.spec for f in slow_fakes], policy_kwargs=WHOLE_COPY, admission=HOLDING)
    loads = router.runtime.router.loads.loads
    wait_for(lambda: len(loads) == 2 and all(load.prefill_tokens_per_s for load in loads.values()),
             what="both replicas' prefill rates")
    assert httpx.post(router.url + "/v1/completions", json={"prompt": SHARED, "max_tokens": 2},
                      timeout=30).status_code == 200
    for fake in slow_fakes:
        fake.configure(delay=DELAY_S)
    try:
        busy = _post(router, SHARED + TAILS[0])
        wait_for(lambda: any(load.in_flight for load in loads.values()), timeout=5, what="the first tail sent")
        impatient = [threading.Thread(target=_gives_up, args=(router, SHARED + tail), daemon=True)
                     for tail in TAILS[1:4]]
        for thread in impatient:
            thread.start()
        wait_for(lambda: any(load.held_requests for load in loads.values()), timeout=5, what="a waiter held")
        for thread in impatient:
            thread.join(10)
        wait_for(lambda: all(load.held_requests == load.held_prefill_tokens == 0 for load in loads.values()),
                 timeout=2, what="the holds of the clients that left gone")
    finally:
        for fake in slow_fakes:
            fake.configure(delay=0)
    busy.join(30)


def _gives_up(router, prompt: list[int]) -> None:
    try:
        httpx.post(router.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 2}, timeout=1.5)
    except httpx.TimeoutException:
        pass
