"""A request of many sequences takes that many of its replica's slots in the router's view: ``in_flight`` counts
sequences (a completion's prompts x the larger of ``n`` and ``best_of``, a chat's ``n``), as the replica counts
its running requests, so admission holds what the replica cannot run instead of sending it to wait there. Counted
per request, 24 requests of ``n: 128`` were all let through to two replicas of 256 slots each, and another
tenant's 16-token completion waited 10 s in a replica's queue behind them."""

from __future__ import annotations

import threading
import time

import httpx

from .. import openai_pair
from ..openai_pair import AUTH

pair = openai_pair.pair  # the fixture: a replica of max_num_seqs 32 behind a router
ADMIN = {"Authorization": "Bearer admin-key"}
SLOTS, N, REQUESTS = 32, 16, 6


def _replicas(router: str) -> dict:
    return httpx.get(router + "/replicas", headers=ADMIN, timeout=10).json()


def _in_flight(router: str) -> int:
    return _replicas(router)["replicas"][0]["in_flight"]


def test_a_request_of_n_choices_takes_n_slots_and_admission_holds_what_does_not_fit(pair):
    _, router = pair
    statuses: list[int] = []

    def send(i: int) -> None:
        body = {"prompt": [1, 5 + i], "n": N, "max_tokens": 120, "ignore_eos": True}
        statuses.append(httpx.post(router + "/v1/completions", headers=AUTH, json=body, timeout=120).status_code)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(REQUESTS)]
    for t in threads:
        t.start()
    seen, waiting = [], []
    while any(t.is_alive() for t in threads):
        body = _replicas(router)
        seen.append(body["replicas"][0]["in_flight"])
        waiting.append(body["waiting"])  # what the autoscaler adds to the in-flight count
        time.sleep(0.02)
    for t in threads:
        t.join()
    assert statuses == [200] * REQUESTS
    assert max(seen) >= N, f"in_flight counted requests, not sequences: {max(seen)}"
    assert max(seen) <= SLOTS + N, f"{max(seen)} sequences sent to a replica of {SLOTS} slots"
    assert max(waiting) >= 1, "the requests admission held were not in GET /replicas"
    assert max(waiting) <= REQUESTS - 1
    assert _in_flight(router) == 0 and _replicas(router)["waiting"] == 0


def test_requests_that_fit_the_replicas_slots_all_go_at_once_not_one_at_a_time(pair):
    """A replica counts a request from its queueing, before its engine thread takes it in; published then as
    waiting beside one running, it taught admission that the replica runs one request at a time, and eight clients
    were served one by one (a fifth of the throughput)."""
    _, router = pair
    clients, seen, statuses = 8, [], []

    def send(i: int) -> None:
        for k in range(3):
            body = {"prompt": [1, 40 + i, 7 + k], "max_tokens": 80, "ignore_eos": True}
            statuses.append(httpx.post(router + "/v1/completions", headers=AUTH, json=body, timeout=120).status_code)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        seen.append(_in_flight(router))
        time.sleep(0.02)
    for t in threads:
        t.join()
    assert statuses == [200] * clients * 3
    assert sorted(seen)[len(seen) // 2] >= clients - 2, f"in flight at once, median {sorted(seen)[len(seen) // 2]}"
