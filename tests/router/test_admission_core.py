"""Admission's policy core (router/admission): pure, clock passed in, milliseconds per test."""

from __future__ import annotations

import pytest
from kvmesh.router.admission.config import AdmissionConfig
from kvmesh.router.admission.decisions import DEADLINE, GO, OVER_LIMIT, QUEUE_FULL, WAIT, Admission, Shed
from kvmesh.router.admission.fair_share import weighted_tokens
from kvmesh.router.admission.ledger import LocalLedger
from kvmesh.router.admission.queue import AdmissionQueue, Waiter
from kvmesh.router.admission.rate_limit import TokenRate
from kvmesh.router.admission.room import DrainRate, LearnedSlots, ReplicaRoom, SlotCapacity
from kvmesh.router.admission.tenants import DEFAULT_TENANT, KeyEntry, Tenant, Tenants, load_keys_file


def _admission(**kw) -> Admission:
    config = AdmissionConfig(**kw)
    return Admission(config, LocalLedger(config.fair_share_half_life_s))


def _waiter(tenant: str, priority: int = 0) -> Waiter:
    return Waiter("m", tenant, priority, 0.0, None, 10)


def test_queue_serves_the_lowest_priority_value_first_whatever_the_arrival():
    queue = AdmissionQueue()
    late_urgent = _waiter("b", priority=-1)
    for w in (_waiter("a", 5), _waiter("a", 0), late_urgent):
        queue.push(w)
    assert queue.head(lambda t: 0.0) is late_urgent
    queue.remove(late_urgent)
    assert queue.head(lambda t: 0.0).priority == 0
    assert len(queue) == 2 and queue.best_priority == 0


def test_within_a_priority_the_tenant_with_least_usage_goes_first_then_arrival():
    queue = AdmissionQueue()
    flood = [_waiter("flooder") for _ in range(50)]
    for w in flood:
        queue.push(w)
    light = _waiter("light")
    queue.push(light)
    usage = {"flooder": 5000.0, "light": 0.0}
    assert queue.head(usage.__getitem__) is light
    queue.remove(light)
    assert queue.head(usage.__getitem__) is flood[0]  # then the flooder, oldest first


def test_the_lookahead_order_is_the_heads_order_while_none_goes_and_is_bounded():
    """Best band first; in it the tenants in turn by usage, each one's oldest first: a flood of 50 behind a light
    tenant's two does not push them out of the first few looked at."""
    queue = AdmissionQueue()
    flood = [_waiter("flooder") for _ in range(50)]
    light = [_waiter("light"), _waiter("light")]
    urgent = _waiter("late", priority=-1)
    for w in (*flood, *light, urgent):
        queue.push(w)
    usage = {"flooder": 5000.0, "light": 0.0, "late": 9e9}
    order = queue.in_order(usage.__getitem__, 5)
    assert order == [urgent, light[0], flood[0], light[1], flood[1]]
    assert order[0] is queue.head(usage.__getitem__)
    assert len(queue.in_order(usage.__getitem__, 100)) == 53 and queue.in_order(usage.__getitem__, 1) == [urgent]


def test_a_removed_waiter_leaves_at_once_and_twice_is_a_no_op():
    queue = AdmissionQueue()
    w = _waiter("a")
    queue.push(w)
    assert queue.remove(w) and not queue.remove(w)
    assert len(queue) == 0 and queue.head(lambda t: 0.0) is None and queue.bands == {}


def test_fair_share_counts_output_twice_and_decays_by_half_life():
    assert weighted_tokens(100, 10) == 120
    ledger = LocalLedger(half_life_s=10.0)
    ledger.charge("a", weighted_tokens(100, 50), 0, None, now=0.0)
    assert ledger.usage("a", 0.0) == pytest.approx(200)
    assert ledger.usage("a", 10.0) == pytest.approx(100)
    assert ledger.usage("a", 20.0) == pytest.approx(50)
    assert ledger.usage("never-seen", 5.0) == 0.0


def test_token_bucket_takes_the_prompt_refills_at_its_rate_and_output_may_go_into_debt():
    ledger, limit = LocalLedger(60.0), TokenRate(tokens_per_s=100, burst_tokens=1000)
    assert ledger.try_take("a", 800, limit, now=0.0) == 0.0
    assert ledger.try_take("a", 300, limit, now=0.0) == pytest.approx(1.0)  # 200 left, 100 more at 100/s
    assert ledger.try_take("a", 300, limit, now=1.0) == 0.0
    ledger.charge("a", 0.0, 500, limit, now=1.0)  # output: level 0 -> -500
    assert ledger.try_take("a", 100, limit, now=1.0) == pytest.approx(6.0)


def test_a_tenant_over_its_token_rate_is_shed_with_the_refill_time_and_takes_nothing():
    adm = _admission()
    tenant = Tenant("t", None, TokenRate(tokens_per_s=10, burst_tokens=100))
    assert isinstance(adm.arrive("m", tenant, 0, 100, None, now=0.0), Waiter)
    shed = adm.arrive("m", tenant, 0, 50, None, now=0.0)
    assert isinstance(shed, Shed) and shed.reason == OVER_LIMIT
    assert shed.retry_after_s == pytest.approx(5.0) and shed.retry_after_header == "5"
    assert "tenant 't' over limit" in shed.message
    assert len(adm.queues["m"]) == 1


def test_the_queue_bound_sheds_with_queue_full():
    adm = _admission(max_queued=2)
    t = Tenant("t")
    assert all(isinstance(adm.arrive("m", t, 0, 1, None, 0.0), Waiter) for _ in range(2))
    shed = adm.arrive("m", t, 0, 1, None, 0.0)
    assert isinstance(shed, Shed) and shed.reason == QUEUE_FULL and "queue for model 'm' is full" in shed.message
    assert isinstance(adm.arrive("other-model", t, 0, 1, None, 0.0), Waiter)  # one queue per model


def test_an_arrival_whose_deadline_the_queue_cannot_meet_is_shed_at_once():
    adm = _admission()
    t = Tenant("t")
    waiting = [adm.arrive("m", t, 0, 1, None, now=0.0) for _ in range(11)]
    for i, w in enumerate(waiting[:10]):  # 10 requests went on in 1 s with a queue behind: the drain rate is measured
        adm.went(w, 1, now=i * 0.1)
    for _ in range(20):
        adm.arrive("m", t, 0, 1, None, now=1.0)
    shed = adm.arrive("m", t, 0, 1, deadline=1.5, now=1.0)
    assert isinstance(shed, Shed) and shed.reason == DEADLINE and shed.retry_after_s > 0.5
    assert isinstance(adm.arrive("m", t, -1, 1, deadline=1.5, now=1.0), Waiter)  # a better priority jumps them


def test_a_light_tenants_arrival_is_not_judged_by_the_floods_queue():
    adm = _admission()
    flood, light = Tenant("flood"), Tenant("light")
    waiting = [adm.arrive("m", flood, 0, 100, None, now=0.0) for _ in range(11)]
    for i, w in enumerate(waiting[:10]):  # 10 requests/s went on, all the flood's: it has used the fleet, light not
        adm.went(w, 100, now=i * 0.1)
    for _ in range(39):  # 4 s of the flood's requests wait
        adm.arrive("m", flood, 0, 100, None, now=1.0)
    assert isinstance(adm.arrive("m", light, 0, 10, deadline=1.5, now=1.0), Waiter)  # fair share serves it next
    shed = adm.arrive("m", flood, 0, 100, deadline=1.5, now=1.0)
    assert isinstance(shed, Shed) and shed.reason == DEADLINE and "41 requests go on before it" in shed.message
    queue = adm.queues["m"]
    usage = {"flood": 1000.0, "light": 0.0, "mid": 10.0}.get
    assert queue.ahead_of(0, "light", usage) == 1  # its own waiter; the heavier flood goes after it
    assert queue.ahead_of(0, "mid", usage) == 1  # light (used less) goes first: its one waiter
    assert queue.ahead_of(1, "light", usage) == 41  # a worse band waits for the whole better one


def test_the_gate_goes_within_admit_ttft_waits_beyond_and_sheds_what_misses_its_deadline():
    adm = _admission(admit_ttft_s=0.5)
    w = adm.arrive("m", Tenant("t"), 0, 1, deadline=2.0, now=0.0)
    assert adm.gate(w, 0.4, room=True, now=0.0) == GO
    assert adm.gate(w, 0.4, room=False, now=0.0) == WAIT  # soon, but its replica has no free slot: not queued there
    assert adm.gate(w, 1.5, room=True, now=0.0) == WAIT  # a free slot, but a long wait predicted
    assert adm.gate(w, 1.5, room=False, now=0.0, idle=True) == GO  # on an idle replica: its own prefill
    assert adm.gate(w, 1.5, room=True, now=0.0, predicted_wait_s=0.3) == GO  # a long prompt, a short wait
    assert adm.gate(w, 1.5, room=True, now=0.0, predicted_wait_s=0.7) == WAIT  # the wait is what is held back
    shed = adm.gate(w, 2.5, room=True, now=0.0)
    assert isinstance(shed, Shed) and shed.reason == DEADLINE and "predicted TTFT is 2.5 s" in shed.message
    late = adm.gate(w, None, room=True, now=2.0)
    assert isinstance(late, Shed) and "its deadline passed" in late.message
    assert adm.expired("m", 2.0) == [w]


def test_without_a_prediction_the_gate_follows_room():
    adm = _admission()
    w = adm.arrive("m", Tenant("t"), 0, 1, None, now=0.0)
    assert adm.gate(w, None, room=True, now=0.0) == GO
    assert adm.gate(w, None, room=False, now=0.0) == WAIT


def test_slots_are_learned_when_a_replica_reports_waiting_requests_and_relearned_after_their_ttl():
    slots = SlotCapacity(ttl_s=30.0)
    learned = {"r": LearnedSlots(), "s": LearnedSlots()}  # what each replica's keeper holds
    assert slots.has_room(ReplicaRoom(learned["r"], in_flight=3, num_running=3, num_waiting=0),
                          now=0.0)  # no sign it queues
    assert not slots.has_room(ReplicaRoom(learned["r"], in_flight=4, num_running=4, num_waiting=2),
                              now=1.0)  # 4 slots, used
    assert (learned["r"].slots, learned["r"].seen_at) == (4, 1.0)
    assert slots.has_room(ReplicaRoom(learned["r"], in_flight=3, num_running=4, num_waiting=0), now=2.0)
    assert not slots.has_room(ReplicaRoom(learned["r"], in_flight=5, num_running=5, num_waiting=0),
                              now=2.0)  # a finishing one
    assert slots.has_room(ReplicaRoom(learned["r"], in_flight=0, num_running=9, num_waiting=9),
                          now=2.0)  # nothing of ours: go
    assert (learned["r"].slots, learned["r"].seen_at) == (9, 2.0)  # what it runs with a queue is its slots now
    assert not slots.has_room(ReplicaRoom(learned["s"], in_flight=4, num_running=4, num_waiting=2),
                              now=1.0)  # s: 4 slots
    assert slots.has_room(ReplicaRoom(learned["s"], in_flight=4, num_running=4, num_waiting=0),
                          now=40.0)  # stale: probe a 5th
    assert not slots.has_room(ReplicaRoom(learned["s"], in_flight=5, num_running=4, num_waiting=0),
                              now=40.0)  # one at a time
    assert slots.has_room(ReplicaRoom(learned["s"], in_flight=6, num_running=6, num_waiting=0),
                          now=41.0)  # it ran 6: a 7th
    # risen, still stale: probed on until the replica shows a queue
    assert (learned["s"].slots, learned["s"].seen_at) == (6, 1.0)
    assert not slots.has_room(ReplicaRoom(learned["s"], in_flight=6, num_running=5, num_waiting=1),
                              now=42.0)  # 5: fresh
    assert (learned["s"].slots, learned["s"].seen_at) == (5, 42.0)


def test_a_replica_that_says_its_max_num_seqs_gets_no_more_at_once():
    slots = SlotCapacity(ttl_s=30.0)
    said = dict(num_running=3, num_waiting=0, max_num_seqs=4)
    learned = {"r": LearnedSlots()}
    assert slots.has_room(ReplicaRoom(learned["r"], in_flight=3, **said), now=0.0)
    assert not slots.has_room(ReplicaRoom(learned["r"], in_flight=4, **said),
                              now=0.0)  # a stale report shows no queue: held
    assert not slots.has_room(ReplicaRoom(learned["r"], in_flight=3, num_running=3, num_waiting=1, max_num_seqs=4),
                              now=1.0)
    assert slots.has_room(ReplicaRoom(learned["r"], in_flight=3, **said),
                          now=40.0)  # its KV ran 3: learned, then probed to 4
    assert not slots.has_room(ReplicaRoom(learned["r"], in_flight=4, **said), now=40.0)  # never past what it says


def test_leaving_charges_the_computed_prompt_and_finishing_twice_the_output():
    adm = _admission()
    limit = TokenRate(100, 1000)
    w = adm.arrive("m", Tenant("t", None, limit), 0, 300, None, now=0.0)
    adm.went(w, 200, now=0.0)  # 100 of its 300 prompt tokens were cached
    assert len(adm.queues["m"]) == 0 and adm.ledger.usage("t", 0.0) == pytest.approx(200)
    adm.finished(w, 50, now=0.0)
    assert adm.ledger.usage("t", 0.0) == pytest.approx(300)
    assert adm.ledger.try_take("t", 700, limit, now=0.0) == pytest.approx(0.5)  # 1000 - 300 - 50 = 650 left


def test_a_key_priority_is_its_default_and_min_priority_the_best_its_holder_may_ask_for():
    adm = _admission()
    batch, gateway, user = Tenant("batch", 10, None, 10), Tenant("gw", 0, None, -5), Tenant("u")
    assert adm.priority_of(batch, None) == 10
    assert adm.priority_of(batch, 0) == 10 and adm.priority_of(batch, 20) == 20
    assert adm.priority_of(gateway, None) == 0 and adm.priority_of(gateway, -9) == -5
    assert adm.priority_of(user, None) == 0 and adm.priority_of(user, -5) == 0  # no better than 0 by default


def test_deadlines_per_priority_class_and_the_header_overrides():
    adm = _admission(ttft_deadline_s={0: 1.0, 10: 30.0})
    assert adm.deadline_of(0, None, now=100.0) == 101.0
    assert adm.deadline_of(5, None, now=100.0) == 101.0  # class 0 covers 0..9
    assert adm.deadline_of(15, None, now=100.0) == 130.0
    assert adm.deadline_of(-3, None, now=100.0) == 101.0  # below every class: the first
    assert adm.deadline_of(15, 0.25, now=100.0) == 100.25
    assert _admission().deadline_of(0, None, 0.0) is None


def test_tenants_from_keys_every_other_caller_shares_one():
    tenants = Tenants([KeyEntry("sk-aaaaaaaa", "team-a", 3, tokens_per_s=10.0),
                       KeyEntry("sk-bbbbbbbb", "team-a")], default_limit=TokenRate(5, 50), burst_s=2.0)
    a = tenants.resolve("sk-aaaaaaaa", "whoever")
    assert (a.name, a.priority, a.limit, a.min_priority) == ("team-a", 3, TokenRate(10.0, 20.0), 3)
    assert tenants.resolve("sk-bbbbbbbb", None).limit == TokenRate(5, 50)
    assert tenants.resolve("not-a-key", "alice") == Tenant(DEFAULT_TENANT, 0, TokenRate(5, 50), 0)  # not "alice"
    assert tenants.holds_header(b"Bearer sk-bbbbbbbb") and not tenants.holds_header(b"Bearer sk-cccccccc")
    assert tenants.resolve(None, None).name == DEFAULT_TENANT


def test_keys_file_errors_name_what_is_wrong(tmp_path):
    path = tmp_path / "keys.yaml"
    path.write_text("keys:\n  - {key: sk-0123456789, tenant: a, tokens_per_s: 100}\n")
    assert load_keys_file(path).resolve("sk-0123456789", None).limit == TokenRate(100, 1000)
    path.write_text("keys:\n  - {key: short, tenant: a}\n")
    with pytest.raises(ValueError, match="shorter than 8"):
        load_keys_file(path)
    path.write_text("keys:\n  - {key: sk-0123456789, tenant: a}\n  - {key: sk-0123456789, tenant: b}\n")
    with pytest.raises(ValueError, match="listed twice"):
        load_keys_file(path)
    path.write_text("keys:\n  - {key: sk-0123456789, tenant: a, rate: 5}\n")
    with pytest.raises(ValueError, match="rate"):
        load_keys_file(path)
    with pytest.raises(ValueError, match="cannot read"):
        load_keys_file(tmp_path / "missing.yaml")


def test_drain_rate_turns_departures_into_a_wait():
    drain = DrainRate(tau_s=5.0)
    assert drain.wait_s(3, 0.0) is None and drain.wait_s(0, 0.0) == 0.0
    for i in range(50):
        drain.record(i * 0.1, still_waiting=True)  # 10 per second with a queue behind them
    assert drain.wait_s(10, 5.0) == pytest.approx(1.0, rel=1e-6)
    drain.record(5.0, still_waiting=False)  # the queue empties; the next departure comes after a quiet minute
    drain.record(65.0, still_waiting=True)
    assert drain.wait_s(10, 65.0) == pytest.approx(1.0, rel=1e-6)  # the quiet minute said nothing of its speed
    fresh = DrainRate()
    for i in range(5):
        fresh.record(i * 2.0, still_waiting=False)  # one light request every 2 s, nobody waiting behind it
    assert fresh.wait_s(48, 10.0) is None  # a burst after it is not judged at 0.5 per second


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="admit_ttft_s"):
        AdmissionConfig(admit_ttft_s=0)
    with pytest.raises(ValueError, match="ttft_deadline_s"):
        AdmissionConfig(ttft_deadline_s={0: -1.0})
