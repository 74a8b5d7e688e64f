"""While a replica is idle the router's queue holds nothing (``admission.hold_while_idle`` off, the default): a request
the gate would hold for its busy replica goes where its predicted TTFT is sooner, into that replica's queue or to the
idle replica. Held in the router, it would wait until room is seen, hidden from the prefix index. With every replica
busy the gate holds it as before, and with ``hold_while_idle`` on it waits for its replica."""

from __future__ import annotations

import threading

import httpx
import pytest
from kvmesh.router.admission.config import AdmissionConfig
from kvmesh.router.routing.receipts import HEADER_OPT_IN

from .conftest import wait_for

HOLDER = "Once upon a time there was a little girl who loved to play in the park with her red ball. " * 6
OTHER = "The old sailor counted the stars above the harbour while the gulls slept on the wet rope. " * 6
DELAY_S = 4.0
"""Seconds a fake replica takes to answer. It reports 1 prompt token per second computed: the first prompt, booked on
its replica until its first token, is minutes of wait there, past ``admit_ttft_s``, and minutes to compute on the
idle replica; the tests set the idle replica's rate apart to say which is sooner."""


@pytest.fixture
def router_of(fakes, start_router):
    def start(**admission):
        for fake in fakes:
            fake.configure(delay=DELAY_S, prefill_tokens_per_s=1.0)
        router = start_router([f.spec for f in fakes], admission=AdmissionConfig(**admission))  # the defaults
        loads = router.runtime.router.loads.loads
        wait_for(lambda: len(loads) == 2 and all(load.prefill_tokens_per_s for load in loads.values()),
                 what="both replicas' prefill rates")
        return router

    yield start
    for fake in fakes:
        fake.configure(prefill_tokens_per_s=0.0)


class Fleet:
    """Requests to a router in front of the two fakes, and what it sees of them."""

    def __init__(self, router, fakes, tag: str) -> None:
        self.router, self.fakes, self.tag, self.answers, self.threads = router, fakes, tag, [], []
        self.loads = router.runtime.router.loads.loads

    def post(self, base: str) -> None:
        prompt = f"{self.tag} {base}"  # the fakes outlive a test: none of them holds this prompt yet
        def post() -> None:
            self.answers.append(httpx.post(self.router.url + "/v1/completions", timeout=30,
                                           json={"prompt": prompt, "max_tokens": 2}, headers={HEADER_OPT_IN: "1"}))

        self.threads.append(threading.Thread(target=post, daemon=True))
        self.threads[-1].start()

    def in_flight(self) -> list[int]:
        return sorted(load.in_flight for load in self.loads.values())

    def waiting(self) -> int:
        return len(self.router.runtime.admission.admission.queues.get("") or ())

    def holder_busy(self) -> tuple[object, object]:
        """The first request on its replica: (that replica's fake, the idle one's)."""
        wait_for(lambda: self.in_flight() == [0, 1], timeout=5, what="the first request on its replica")
        busy = next(rid for rid, load in self.loads.items() if load.in_flight == 1)
        fakes = sorted(self.fakes, key=lambda f: f.name != busy)
        return fakes[0], fakes[1]

    def rate_seen(self, fake, rate: float) -> None:
        fake.configure(prefill_tokens_per_s=rate)
        wait_for(lambda: self.loads[fake.name].prefill_tokens_per_s == rate, what=f"the rate {rate} seen")

    def answered(self) -> list[str]:
        for thread in self.threads:
            thread.join(30)
        assert [a.status_code for a in self.answers] == [200] * len(self.threads)
        return [a.headers["x-kvmesh-replica"] for a in self.answers]


def test_a_request_sooner_on_the_idle_replica_goes_there(router_of, fakes):
    fleet = Fleet(router_of(), fakes, "Sooner idle.")
    fleet.post(HOLDER)
    _, idle = fleet.holder_busy()
    fleet.rate_seen(idle, 1000.0)  # the prompt computed there in a tenth of a second, not behind the holder's
    fleet.post(HOLDER)
    wait_for(lambda: fleet.in_flight() == [1, 1], timeout=DELAY_S / 2, what="the second request on the idle replica")
    assert fleet.waiting() == 0
    first, second = fleet.answered()
    assert first != second
    # Its receipt tells a choice of the cost, not a prefix known nowhere: the busy holder offered the most.
    receipt = next(a.headers for a in fleet.answers if a.headers["x-kvmesh-replica"] == idle.name)
    assert int(receipt["x-kvmesh-predicted-hit-tokens"]) == 0 < int(receipt["x-kvmesh-best-hit-tokens"])


def test_a_request_sooner_behind_its_holder_goes_into_its_queue_and_none_waits_in_the_router(router_of, fakes):
    fleet = Fleet(router_of(), fakes, "Sooner queued.")
    fleet.post(HOLDER)
    _, idle = fleet.holder_busy()
    fleet.rate_seen(idle, 0.5)  # the holder's queue (the first prompt, booked there) is half of computing it here
    fleet.post(HOLDER)
    wait_for(lambda: fleet.in_flight() == [0, 2], timeout=DELAY_S / 2, what="the second request on its holder")
    assert fleet.waiting() == 0
    fleet.post(OTHER)  # goes to the idle replica: nothing of it is cached anywhere
    first, second, third = fleet.answered()
    assert first == second != third


def test_held_while_idle_it_waits_in_the_router(router_of, fakes):
    fleet = Fleet(router_of(hold_while_idle=True), fakes, "Held while idle.")
    fleet.post(HOLDER)
    fleet.holder_busy()
    fleet.post(HOLDER)  # held for its holder though the other replica is idle
    wait_for(lambda: fleet.waiting() == 1, timeout=5, what="the second request waiting in the router")
    assert fleet.in_flight() == [0, 1]
    fleet.answered()


def test_with_every_replica_busy_the_request_waits(router_of, fakes):
    fleet = Fleet(router_of(), fakes, "All busy.")
    fleet.post(HOLDER)
    fleet.holder_busy()
    fleet.post(OTHER)  # nothing cached: the idle replica takes it
    wait_for(lambda: fleet.in_flight() == [1, 1], timeout=5, what="both replicas busy")
    fleet.post(HOLDER)  # no replica idle: held for its holder
    wait_for(lambda: fleet.waiting() == 1, timeout=DELAY_S / 2, what="the third request waiting in the router")
    assert fleet.in_flight() == [1, 1]
    fleet.answered()


def test_a_flooder_takes_no_idle_replica_before_a_lighter_tenant(fakes, start_router, tmp_path):
    """Hostile: a tenant floods both replicas while another asks once. Each replica that frees is idle, and the queue
    hands it to its waiters in their serving order: the light tenant's request before the flooder's older ones."""
    keys = {"flood": "sk-flood-0123456789", "light": "sk-light-0123456789"}
    path = tmp_path / "keys.yaml"
    path.write_text("keys:\n" + "".join(f"  - {{key: {key}, tenant: {name}}}\n" for name, key in keys.items()))
    for fake in fakes:
        fake.configure(delay=2.0, prefill_tokens_per_s=1.0)
    try:
        router = start_router([f.spec for f in fakes], admission=AdmissionConfig(keys_file=str(path)))
        loads = router.runtime.router.loads.loads
        wait_for(lambda: len(loads) == 2 and all(load.prefill_tokens_per_s for load in loads.values()),
                 what="both replicas' prefill rates")
        done: list = []

        def post(tenant: str, text: str) -> None:
            r = httpx.post(router.url + "/v1/completions", timeout=60, json={"prompt": text, "max_tokens": 2},
                           headers={"Authorization": f"Bearer {keys[tenant]}"})
            done.append((tenant, r.status_code))

        queue = lambda: router.runtime.admission.admission.queues.get("") or ()  # noqa: E731
        threads = [threading.Thread(target=post, args=("flood", f"Flood {i}. {OTHER}"), daemon=True)
                   for i in range(6)]
        for thread in threads:
            thread.start()
        wait_for(lambda: len(queue()) == 4, timeout=5, what="four of the flood waiting, two on the replicas")
        threads.append(threading.Thread(target=post, args=("light", f"Light. {HOLDER}"), daemon=True))
        threads[-1].start()
        wait_for(lambda: len(queue()) == 5, timeout=5, what="the light request waiting with them")
        for thread in threads:
            thread.join(60)
    finally:
        for fake in fakes:
            fake.configure(delay=0, prefill_tokens_per_s=0.0)
    assert all(status == 200 for _, status in done), done
    assert [tenant for tenant, _ in done].index("light") <= 3, done  # after the two running, with the first freed
