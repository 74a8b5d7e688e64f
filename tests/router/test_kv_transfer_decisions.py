"""Where KV moves, decided without I/O (router/routing/kv_placement.py): replica roles, the P/D split's prefill
replica, and peer pulls priced in seconds with the host tier's load-back form (``load.copy_seconds``)."""

from __future__ import annotations

import pytest
from kvmesh.replica.serving.load_report import LoadReport
from kvmesh.router.config import ReplicaSpec, RouterConfig, build_router
from kvmesh.router.control.probes import decode_transfer
from kvmesh.router.replicas.load import ReplicaLoad, copy_seconds
from kvmesh.router.routing.cost import FleetRates
from kvmesh.router.routing.kv_placement import (
    SPLIT_NO_ROOM,
    SPLIT_SLOWER,
    KVPlacementRules,
    price_pull,
    price_split,
)
from kvmesh.router.routing.kv_router import KVRouter
from kvmesh.router.routing.policies import NoReplicaError

from .helpers import LAYOUT, stored

BS = 16
PROMPT = list(range(1000, 1000 + 32 * BS + 5))  # 32 full blocks and a tail
TRANSFER = {"enabled": True, "pull_bytes_per_s": 10e9, "bytes_per_token": 1 << 16,  # 1 MiB blocks at 10 GB/s
            "layout": LAYOUT}


def report(running: int = 0, waiting_prefill: int = 0, rate: float | None = 10_000.0) -> LoadReport:
    return LoadReport(num_requests_running=running, num_requests_waiting=0, kv_cache_usage=0.0,
                      num_waiting_prefill_tokens=waiting_prefill, prefill_tokens_per_s=rate)


def make_router(roles: dict[str, str], transfer: dict | None = TRANSFER, **rules) -> KVRouter:
    router = KVRouter(block_size=BS, predict_ttl_s=0.0, transfers=KVPlacementRules(**rules))
    for rid, role in roles.items():
        router.add_replica(rid, role=role)
        router.loads.loads[rid].update_report(report())
        router.loads.loads[rid].update_transfer(transfer)
    return router


# ---------------------------------------------------------------- roles
def test_replica_spec_takes_a_role_and_the_old_form_means_both():
    assert ReplicaSpec.parse("http://h:1").role == "both"
    assert ReplicaSpec.parse("http://h:1,role=prefill,name=p").role == "prefill"
    assert ReplicaSpec.parse("http://h:1/v1,events=tcp://h:2,role=decode").role == "decode"


def test_a_bad_role_names_the_field_and_the_choices():
    with pytest.raises(ValueError, match=r"role='prefil' is not a replica role; choose one of prefill, decode, both"):
        ReplicaSpec.parse("http://h:1,role=prefil")
    with pytest.raises(ValueError, match="role=prefill|decode|both"):
        ReplicaSpec.parse("http://h:1,rol=prefill")


def test_prefill_replicas_never_get_a_request_to_decode():
    router = make_router({"p": "prefill", "d": "decode"})
    router.apply_events("p", [stored(PROMPT, BS)])  # the prefill replica even holds the prompt
    assert {router.route(PROMPT).replica_id for _ in range(20)} == {"d"}
    router.set_healthy(router.replicas.get("d"), False)
    with pytest.raises(NoReplicaError, match="role prefill"):
        router.route(PROMPT)


def test_router_settings_for_transfers_are_checked():
    rules = KVPlacementRules(pd_min_uncached_tokens=64)
    assert build_router(RouterConfig(transfers=rules), seed=1).transfers is rules  # the section, handed whole
    with pytest.raises(ValueError, match="pd_min_uncached_tokens"):
        KVPlacementRules(pd_min_uncached_tokens=0)
    with pytest.raises(ValueError, match="peer_pull_overhead_s"):
        KVPlacementRules(peer_pull_overhead_s=-1)
    with pytest.raises(ValueError, match="pd_ttft_slack_s"):
        KVPlacementRules(pd_ttft_slack_s=-0.1)
    assert build_router(RouterConfig(transfers=KVPlacementRules(pd_ttft_slack_s=None)),
                        seed=1).transfers.pd_ttft_slack_s is None


# ---------------------------------------------------------------- the split
def split_of(router, decision):
    """``choose_split``'s answer, its prefill replica named by id."""
    choice = router.choose_split(decision)
    return None if choice.prefill is None else choice.prefill.id, choice.skipped


def test_split_only_for_a_long_uncached_suffix_on_the_decode_replica():
    router = make_router({"p": "prefill", "d": "decode"}, pd_min_uncached_tokens=256)
    assert split_of(router, router.route(PROMPT)) == ("p", None)  # 517 uncached tokens
    assert split_of(router, router.route(PROMPT[:200])) == (None, None)  # 200 < 256
    router.apply_events("d", [stored(PROMPT, BS, num_blocks=24)])  # 517 - 384 = 133 uncached on d
    assert split_of(router, router.route(PROMPT)) == (None, None)


def test_token_rules_split_to_the_least_loaded_prefill_replica_with_room():
    router = make_router({"p1": "prefill", "p2": "prefill", "d": "both"}, pd_max_prefill_backlog_tokens=4096,
                         pd_ttft_slack_s=None)
    router.loads.loads["p1"].update_report(report(waiting_prefill=3000))
    assert split_of(router, router.route(PROMPT))[0] == "p2"
    router.loads.loads["p2"].update_report(report(waiting_prefill=5000))  # over the limit: no room
    assert split_of(router, router.route(PROMPT))[0] == "p1"
    router.loads.loads["p1"].update_report(report(waiting_prefill=4096))
    assert split_of(router, router.route(PROMPT)) == (None, SPLIT_NO_ROOM)
    router.loads.loads["p1"].update_report(report())
    router.set_healthy(router.replicas.get("p1"), False)  # down, draining or ejected: no room either
    assert split_of(router, router.route(PROMPT)) == (None, SPLIT_NO_ROOM)


def test_a_split_that_costs_more_first_token_time_than_it_saves_is_skipped_slower():
    router = make_router({"p": "prefill", "d": "decode"}, pd_ttft_slack_s=0.25)
    router.loads.loads["p"].update_report(report(waiting_prefill=5000))  # 0.5 s of queue, under the token cap
    assert split_of(router, router.route(PROMPT)) == (None, SPLIT_SLOWER)
    router.loads.loads["d"].update_report(report(waiting_prefill=6000))  # home is slower still: 0.6 s of queue
    assert split_of(router, router.route(PROMPT)) == ("p", None)


@pytest.mark.parametrize(("weight", "split"), [(1.0, True), (0.0, False)])
def test_a_split_may_cost_the_first_token_the_stall_it_saves_the_decode_batch(weight, split):
    router = make_router({"p": "prefill", "d": "decode"}, pd_ttft_slack_s=0.0, pd_stall_weight=weight)
    router.loads.loads["p"].update_report(report(waiting_prefill=2000))  # the split costs 0.21 s more
    assert split_of(router, router.route(PROMPT)) == (None, SPLIT_SLOWER)  # d idle: it saves nothing
    router.loads.loads["d"].update_report(report(running=5))  # 5 decoding x 52 ms of suffix: 0.26 s saved
    assert split_of(router, router.route(PROMPT)) == (("p", None) if split else (None, SPLIT_SLOWER))


def test_an_idle_decode_replica_still_hands_a_long_prompt_off_within_the_slack():
    router = make_router({"p": "prefill", "d": "decode"})  # defaults: 0.5 s covers the move and a round trip
    choice = router.choose_split(router.route(PROMPT))
    assert choice.prefill.id == "p" and choice.price.split_s > choice.price.local_s and choice.price.stall_s == 0


@pytest.mark.parametrize(("slack_s", "chosen"), [(0.5, "p2"), (None, "p1")])
def test_the_split_goes_to_the_prefill_replica_with_the_earliest_first_token_not_the_shortest_queue(slack_s, chosen):
    router = make_router({"p1": "prefill", "p2": "prefill", "d": "decode"}, pd_ttft_slack_s=slack_s)
    router.apply_events("p2", [stored(PROMPT, BS)])  # p2 holds the prompt: it computes 5 tokens, not 517
    router.loads.loads["p2"].update_report(report(waiting_prefill=300))
    router.loads.loads["p1"].update_report(report(waiting_prefill=100))
    choice = router.choose_split(router.route(PROMPT))
    assert choice.prefill.id == chosen  # None: the token rules, the shortest backlog
    if slack_s is not None:
        assert choice.price.split_s == pytest.approx((300 + 5) / 10_000 + 32 * (1 << 20) / 10e9 + 0.01)


def test_without_measured_prefill_rates_the_token_rules_decide():
    router = make_router({"p": "prefill", "d": "decode"})
    router.loads.loads["p"].update_report(report(waiting_prefill=15_000, rate=None))  # slow, but unpriced
    choice = router.choose_split(router.route(PROMPT))
    assert choice.prefill.id == "p" and choice.price is None
    router.loads.loads["p"].update_report(report(waiting_prefill=16_384, rate=None))  # the hard bound holds
    assert split_of(router, router.route(PROMPT)) == (None, SPLIT_NO_ROOM)


def test_the_move_is_priced_at_the_decode_replicas_pull_rate():
    decode, prefill = ReplicaLoad(prefill_tokens_per_s=10_000.0), ReplicaLoad(prefill_tokens_per_s=20_000.0)
    decode.update_transfer(dict(TRANSFER, pull_bytes_per_s=1e8))  # 32 MiB at 100 MB/s: 0.34 s
    price = price_split(decode, prefill, 517, 517, 32, BS, KVPlacementRules(peer_pull_overhead_s=0.01))
    assert price.split_s == pytest.approx(517 / 20_000 + 32 * (1 << 20) / 1e8 + 0.01)
    assert price.local_s == pytest.approx(517 / 10_000)  # the split costs 0.32 s more, and d is idle
    assert not price.worth_it(KVPlacementRules(pd_ttft_slack_s=0.25))
    assert price.worth_it(KVPlacementRules(pd_ttft_slack_s=0.5))
    assert price_split(ReplicaLoad(prefill_tokens_per_s=10_000.0), prefill, 517, 517, 32, BS, KVPlacementRules(
        peer_pull_assumed_bytes_per_s=0)) is None  # no bytes per token reported: the move cannot be priced


def test_no_prefill_replica_no_split():
    router = make_router({"a": "both", "b": "both"}, pd_min_uncached_tokens=1)
    assert split_of(router, router.route(PROMPT)) == (None, None)


# ---------------------------------------------------------------- pricing
def test_pull_and_load_back_share_one_cost_form():
    load = ReplicaLoad(kv_block_bytes=1 << 20, h2d_bytes_per_s=20e9, pull_bytes_per_s=10e9)
    assert load.load_back_s(32) == copy_seconds(32, 1 << 20, 20e9) == pytest.approx(32 * (1 << 20) / 20e9)
    assert load.pull_s(32, BS, overhead_s=0.01) == pytest.approx(32 * (1 << 20) / 10e9 + 0.01)
    assert copy_seconds(0, None, None) == 0.0 and copy_seconds(3, None, 1e9) is None


def test_pull_block_bytes_come_from_bytes_per_token_and_an_unmeasured_rate_is_assumed():
    load = ReplicaLoad()
    load.update_transfer({"enabled": True, "pull_bytes_per_s": None, "bytes_per_token": 1000, "layout": LAYOUT})
    assert load.kv_transfer_enabled and load.pull_bytes_per_s is None
    assert load.pull_s(10, BS, 0.0) is None  # no rate, none assumed: cannot be priced
    assert load.pull_s(10, BS, 0.0, assumed_bytes_per_s=16_000) == pytest.approx(10.0)


def test_price_pull_compares_seconds_of_copy_and_of_recompute():
    chosen, holder = ReplicaLoad(prefill_tokens_per_s=10_000.0), ReplicaLoad()
    chosen.update_transfer(TRANSFER)
    holder.update_transfer(TRANSFER)
    none = FleetRates()
    pull_s, recompute_s = price_pull(chosen, holder, 32, BS, none, KVPlacementRules(peer_pull_overhead_s=0.01))
    assert pull_s == pytest.approx(32 * (1 << 20) / 10e9 + 0.01) and recompute_s == pytest.approx(32 * BS / 10_000)
    chosen.pull_fixed_s = 0.002  # measured: the prior is left
    assert price_pull(chosen, holder, 32, BS, none, KVPlacementRules(peer_pull_overhead_s=0.01))[0] == pytest.approx(
        32 * (1 << 20) / 10e9 + 0.002)
    holder.update_transfer({"enabled": False})
    assert price_pull(chosen, holder, 32, BS, none, KVPlacementRules()) is None  # both ends must be enabled
    holder.update_transfer(TRANSFER)
    chosen.prefill_tokens_per_s = None  # the slowest rate another candidate measured
    slow = FleetRates(prefill_s_per_token=1 / 5_000)
    assert price_pull(chosen, holder, 32, BS, slow, KVPlacementRules())[1] == pytest.approx(32 * BS / 5_000)
    assert price_pull(chosen, holder, 32, BS, none, KVPlacementRules()) is None  # no rate anywhere


def busy_holder_router(transfer=TRANSFER, **rules) -> KVRouter:
    """``a`` holds the prompt but is busy: cache_aware sends it to ``b``."""
    router = make_router({"a": "both", "b": "both"}, transfer, **rules)
    router.apply_events("a", [stored(PROMPT, BS)])
    router.loads.loads["a"].update_report(report(running=500))
    return router


def test_a_request_sent_away_from_the_holder_pulls_when_that_is_cheaper():
    decision = busy_holder_router().route(PROMPT)
    assert decision.replica_id == "b"
    assert decision.pull.holder.id == "a" and decision.pull.num_tokens == 32 * BS
    assert decision.pull.pull_s < decision.pull.recompute_s


def test_no_pull_when_recomputing_is_cheaper_or_transfer_is_off_or_the_holder_was_chosen():
    slow = dict(TRANSFER, pull_bytes_per_s=1e6)  # 32 MiB at 1 MB/s: 33 s against 51 ms of prefill
    assert busy_holder_router(slow).route(PROMPT).pull is None
    assert busy_holder_router({"enabled": False}).route(PROMPT).pull is None
    assert busy_holder_router(peer_pulls=False).route(PROMPT).pull is None
    idle = busy_holder_router()
    idle.loads.loads["a"].update_report(report())
    decision = idle.route(PROMPT)
    assert decision.replica_id == "a" and decision.pull is None


def test_load_report_kv_transfer_is_read_whatever_the_report():
    raw = (b'{"num_requests_running": 0, "num_requests_waiting": 0, "kv_cache_usage": 0.0, '
           b'"num_waiting_prefill_tokens": 0, "kv_transfer": {"enabled": true, "pull_bytes_per_s": 2.5e9, '
           b'"bytes_per_token": 4096}}')
    assert decode_transfer(raw) == {"enabled": True, "pull_bytes_per_s": 2.5e9, "bytes_per_token": 4096}
    assert decode_transfer(b'{"num_requests_running": 1}') is None
    assert decode_transfer(b'{"kv_transfer": 3}') is None
