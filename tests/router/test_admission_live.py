"""Admission through a real router in front of a fake replica (router/http/admission_gate.py): the order the
router's queue serves (priority, then the lighter tenant) and its 429s with Retry-After and a reason."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from kvmesh.router.admission.config import AdmissionConfig
from kvmesh.router.admission.room import LearnedSlots

from .conftest import wait_for

KEYS = {"flood": "sk-flood-0123456789", "light": "sk-light-0123456789", "capped": "sk-capped-0123456789"}
DELAY_S = 0.4


@pytest.fixture
def admitting(fakes, start_router, tmp_path):
    """A router with a keys file in front of fake replica "a" answering each completion after 0.4 s, one at a
    time as far as the router knows (its slots: what its /load would teach it once it queued)."""
    keys = tmp_path / "keys.yaml"
    keys.write_text("keys:\n" + "".join(f"  - {{key: {key}, tenant: {name}}}\n" for name, key in KEYS.items()
                                        if name == "light")
                    + f"  - {{key: {KEYS['flood']}, tenant: flood, min_priority: -1}}\n"
                    + f"  - {{key: {KEYS['capped']}, tenant: capped, tokens_per_s: 1, burst_tokens: 5}}\n")
    a = fakes[0]
    a.configure(delay=DELAY_S)
    router = start_router([a.spec], admission=AdmissionConfig(keys_file=str(keys)))
    wait_for(lambda: router.runtime.router.healthy, what="the replica healthy")
    router.runtime.router.replicas.get("a").learned_slots = LearnedSlots(1, time.monotonic())  # one slot, learned
    return router


def _post(router, tenant: str, text: str, done: list, headers: dict | None = None, stream: bool = False):
    r = httpx.post(router.url + "/v1/completions", timeout=30,
                   headers={"Authorization": f"Bearer {KEYS[tenant]}", **(headers or {})},
                   json={"prompt": text, "max_tokens": 2, "stream": stream})
    done.append((time.monotonic(), tenant, r.status_code, (headers or {}).get("x-kvmesh-priority")))
    return r


def test_the_queue_serves_priority_first_then_the_light_tenant_before_a_flooder(admitting, fakes):
    fakes[0].configure(delay=3.0)  # the first request held until the late ones have queued, however loaded
    done: list = []
    threads = [threading.Thread(target=_post, args=(admitting, "flood", f"flood request {i} " * 4, done))
               for i in range(5)]
    for t in threads:
        t.start()
    queue = lambda: admitting.runtime.admission.admission.queues.get("") or ()  # noqa: E731
    wait_for(lambda: len(queue()) == 4, timeout=5, what="the flood waiting in the router, one of it on the replica")
    fakes[0].configure(delay=DELAY_S)  # the ones after it
    late = [threading.Thread(target=_post, args=(admitting, "light", "a light tenant's question", done),
                             kwargs={"stream": True}),
            threading.Thread(target=_post, args=(admitting, "flood", "an urgent flood request", done),
                             kwargs={"headers": {"x-kvmesh-priority": "-1"}})]
    for t in late:
        t.start()
    wait_for(lambda: len(queue()) == 6, timeout=5, what="the late requests queued")
    for t in threads + late:
        t.join(30)
    order = [(tenant, priority) for _, tenant, status, priority in sorted(done) if status == 200]
    assert len(order) == 7, done
    timeline = [(round(t - done[0][0], 3), n, s, p) for t, n, s, p in sorted(done)]
    assert order[1] == ("flood", "-1"), timeline  # priority first: it came last and went right after the one running
    assert order[2] == ("light", None)  # then the tenant that used least, before 4 older flood requests
    text = httpx.get(admitting.url + "/metrics").text
    assert 'kvmesh_router_admission_queued_total{priority="all",tenant="light"} 1.0' in text
    assert 'kvmesh_router_admission_admitted_total{priority="all",tenant="flood"} 6.0' in text
    assert 'kvmesh_router_admission_ttft_seconds_count{priority="all",tenant="light"} 1.0' in text


def test_429s_carry_retry_after_and_name_their_reason(admitting, fakes):
    assert _post(admitting, "capped", "a prompt longer than its bucket", []).status_code == 200  # a full bucket
    r = _post(admitting, "capped", "a prompt longer than five tokens for sure", [])
    assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
    error = r.json()["error"]
    assert error["type"] == "tenant_over_limit" and "tenant 'capped' over limit" in error["message"]

    fakes[0].configure(delay=2.0)  # the replica held long enough that nothing is let go while the light tenant waits
    done: list = []
    busy = [threading.Thread(target=_post, args=(admitting, "flood", f"busy {i} " * 4, done)) for i in range(3)]
    for t in busy:
        t.start()
    queue = admitting.runtime.admission.admission.queues
    wait_for(lambda: len(queue.get("") or ()) == 2, timeout=5, what="one flood request on the replica, two waiting")
    t0 = time.monotonic()
    r = _post(admitting, "light", "in a hurry", done, headers={"x-kvmesh-ttft-deadline-ms": "100"})
    assert r.status_code == 429 and time.monotonic() - t0 < 1.0  # shed by its deadline, not left waiting
    assert r.json()["error"]["type"] == "deadline_unreachable" and int(r.headers["retry-after"]) >= 1
    with pytest.raises(httpx.ReadTimeout):  # a client that gives up while its request waits ...
        httpx.post(admitting.url + "/v1/completions", headers={"Authorization": f"Bearer {KEYS['light']}"},
                   json={"prompt": "impatient", "max_tokens": 2}, timeout=httpx.Timeout(5, read=0.1))
    wait_for(lambda: not any(w.tenant == "light" for w in queue[""]), timeout=2, what="it left the queue")  # ... leaves
    text = httpx.get(admitting.url + "/metrics").text  # unserved: it left, it was not let go
    assert 'kvmesh_router_admission_admitted_total{priority="all",tenant="light"} 0.0' in text
    bad = _post(admitting, "light", "x", [], headers={"x-kvmesh-priority": "high"})
    assert bad.status_code == 400 and "x-kvmesh-priority" in bad.json()["error"]["message"]
    assert httpx.post(admitting.url + "/v1/completions", json={"prompt": "x"}).status_code == 401  # keys required
    tokenize = httpx.post(admitting.url + "/tokenize", json={"prompt": "x"},
                          headers={"Authorization": f"Bearer {KEYS['light']}"})
    assert tokenize.status_code == 200  # a tenant's key opens the app's paths too
    for t in busy:
        t.join(30)
    text = httpx.get(admitting.url + "/metrics").text
    assert 'kvmesh_router_admission_shed_total{priority="all",reason="tenant_over_limit",tenant="capped"} 1.0' in text
    assert 'kvmesh_router_admission_shed_total{priority="all",reason="deadline_unreachable",tenant="light"} 1.0' in text


def test_a_request_with_nothing_waiting_goes_at_once_without_the_queue_machinery(admitting, fakes, monkeypatch):
    """Nothing waits and the replica has room: admitted in the arrival's own call, no future made and no pump run
    (the only pump is its end's, giving its room on), nothing counted as queued."""
    gate = admitting.runtime.admission
    fakes[0].configure(delay=0.0)
    pumps = []
    pump = gate.pump
    monkeypatch.setattr(gate, "pump", lambda model: (pumps.append(model), pump(model)))
    done: list = []
    assert _post(admitting, "light", "a lone question", done).status_code == 200
    wait_for(lambda: pumps, timeout=5, what="the request's end pumping its model")
    time.sleep(0.1)
    assert pumps == [""], pumps
    assert gate.granted == 0 and not gate.ticker.running
    assert not gate.admission.queues[""]
    text = httpx.get(admitting.url + "/metrics").text
    assert 'kvmesh_router_admission_admitted_total{priority="all",tenant="light"} 1.0' in text
    assert 'kvmesh_router_admission_queued_total{priority="all",tenant="light"} 0.0' in text
    assert 'kvmesh_router_admission_queue_seconds_count{priority="all"} 1.0' in text
