"""``kvmesh sim`` with KV that moves between replicas: prefill/decode splits and peer prefix pulls
(cluster/measure/sim/transfer.py), through the real router, real pools and the cost model."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest
from kvmesh.cluster.cli import main
from kvmesh.cluster.measure.sim.config import CostModel, SimConfig, sim_engine
from kvmesh.cluster.measure.sim.loop import run_policy
from kvmesh.cluster.measure.sim.replica import requests_from_mooncake
from kvmesh.cluster.measure.sim.report import format_table
from kvmesh.cluster.measure.sim.run import compare_policies, kv_transfer_variants
from kvmesh.cluster.measure.sim.transfer import transfer_s
from kvmesh.cluster.measure.workloads.block_tokens import BlockTokenCache
from kvmesh.cluster.measure.workloads.traces import MooncakeRecord
from kvmesh.router.config import RouterConfig
from kvmesh.router.routing.kv_placement import KVPlacementRules

BS = 512
LONG_BLOCKS = 16  # an 8192-token prompt: eight 1024-token prefill chunks


def _long_and_chatty(seed: int = 0, n: int = 400) -> list[MooncakeRecord]:
    """A quarter long unique prompts with short answers, the rest 32-token prompts with 400-token answers:
    the long prefills share steps with many decoding sequences unless they run elsewhere."""
    rng = random.Random(seed)
    records, t, next_id = [], 0.0, 1
    for _ in range(n):
        t += rng.expovariate(4.0)
        if rng.random() < 0.25:
            ids = tuple(range(next_id, next_id + LONG_BLOCKS))
            records.append(MooncakeRecord(t * 1000, LONG_BLOCKS * BS, 8, ids))
        else:
            ids = (next_id,)
            records.append(MooncakeRecord(t * 1000, 32, 400, ids))
        next_id += len(ids)
    return records


def _config(**kw) -> SimConfig:
    return SimConfig(engine=sim_engine(block_size=BS, max_num_batched_tokens=1024), blocks_per_replica=400, **kw)


def _run(records, config: SimConfig, policy: str = "cache_aware"):
    tokens = BlockTokenCache(BS, config.vocab_size, config.seed)
    return run_policy(policy, requests_from_mooncake(records, block_size=BS), config, config.blocks_per_replica, tokens)


def _inter_token_p99(run) -> float:
    from kvmesh.cluster.measure.sim.transfer_report import transfer_summary

    return transfer_summary(run)["inter_token_s"]["p99"]


def test_split_moves_long_prefills_off_the_decode_replicas_and_lowers_inter_token_p99():
    records = _long_and_chatty()
    baseline = _run(records, _config(num_replicas=4))
    split = _run(records, _config(num_replicas=3, num_prefill_replicas=1))
    decoding = [rep for rep in split.replicas if rep.role == "decode"]
    assert [rep.role for rep in split.replicas] == ["decode"] * 3 + ["prefill"]
    long = [r for r in split.requests if r.num_prompt_tokens > BS]
    kept = [r for r in long if r.prefill_leg is None]  # the prefill replica's backlog was full, or too slow
    assert len(kept) == split.router.splits_skipped_no_room + split.router.splits_skipped_slower < 0.2 * len(long)
    # the decode replicas compute the short prompts, the long ones kept whole and one token of each split one
    short_tokens = sum(r.num_prompt_tokens for r in split.requests if r.num_prompt_tokens <= BS)
    assert sum(rep.prefill_tokens for rep in decoding) <= (
        short_tokens + sum(r.num_prompt_tokens for r in kept) + len(long) - len(kept))
    assert split.replicas[3].prefill_tokens > 0.8 * sum(r.num_prompt_tokens for r in long)
    # against the token cost of before, which piled long prefills onto decoding replicas; the cost in seconds
    # counts the stall a prefill puts on the decodes there, and keeps inter-token p99 low without a split too
    token_cost = _run(records, _config(num_replicas=4), policy="cache_aware_tokens")
    assert _inter_token_p99(split) < 0.5 * _inter_token_p99(token_cost)
    assert _inter_token_p99(baseline) < 0.5 * _inter_token_p99(token_cost)


def test_short_prompts_are_not_split():
    split = _run(_long_and_chatty(), _config(num_replicas=3, num_prefill_replicas=1))
    short = [r for r in split.requests if r.num_prompt_tokens < KVPlacementRules().pd_min_uncached_tokens]
    long = [r for r in split.requests if r.num_prompt_tokens > BS]
    assert short and all(r.prefill_leg is None and r.num_transferred_tokens == 0 for r in short)
    assert long and all(r.prefill_replica_id in ("3", None) for r in long)  # None: no room, served whole
    assert sum(r.prefill_replica_id == "3" for r in long) > 0.8 * len(long)
    assert all(r.replica_id in ("0", "1", "2") for r in split.requests)  # a prefill replica never decodes


def test_ttft_of_a_split_request_includes_the_transfer():
    cost = CostModel(step_overhead_s=0.001, prefill_s_per_token=1e-4, decode_s_per_step=0.005,
                     decode_s_per_seq=0.0, decode_s_per_context_token=0.0)
    config = _config(num_replicas=1, num_prefill_replicas=1, cost=cost, kv_transfer_bytes_per_s=1e9,
                     kv_transfer_latency_s=0.002)
    prompt = 2 * BS + 100
    record = MooncakeRecord(0.0, prompt, 4, (1, 2, 3))
    (req,) = _run([record], replace(config, engine=sim_engine(block_size=BS, max_num_batched_tokens=4096))).requests
    moved = prompt - 1  # the decode replica computes the last prompt token again
    assert req.prefill_replica_id == "1" and req.replica_id == "0"
    assert req.num_transferred_tokens == moved and req.num_cached_tokens == moved
    expected = (cost.step_time(prompt, 0, 0)  # the prefill leg on the prefill replica
                + 0.002 + moved * config.kv_bytes_per_token / 1e9  # the move
                + cost.step_time(1, 0, 0))  # the decode replica's first step
    assert req.first_token_s - req.arrival_s == pytest.approx(expected)
    assert req.transfer_s == pytest.approx(transfer_s(config, moved))


@pytest.mark.parametrize(("pick", "leg_hit"), [("least_loaded", 0), ("policy", 14 * BS)])
def test_prefill_pick_least_loaded_loses_the_prefix_a_cache_aware_pick_keeps(pick, leg_hit):
    records = [MooncakeRecord(0.0, 16 * BS, 4, tuple(range(1, 17))),
               MooncakeRecord(2000.0, 2 * BS, 4, (100, 101)),  # keeps the first prefill replica a little busy
               MooncakeRecord(2001.0, 16 * BS, 4, (*range(1, 15), 200, 201))]  # the first's 14-block prefix
    # priced in seconds, the third would stay whole (its suffix is short)
    token_rules = RouterConfig(transfers=KVPlacementRules(pd_ttft_slack_s=None))
    run = _run(records, _config(num_replicas=1, num_prefill_replicas=2, pd_prefill_pick=pick, router=token_rules))
    first, _, third = run.requests
    assert third.prefill_leg is not None
    assert (third.prefill_replica_id == first.prefill_replica_id) == (pick == "policy")
    assert third.prefill_leg.num_cached_tokens == leg_hit
    assert third.prefill_computed_tokens == third.num_prompt_tokens - leg_hit


def _shared_prefix(gap_s: float = 10.0) -> list[MooncakeRecord]:
    """Two requests sharing 6 blocks, far enough apart that the first is cached when the second comes."""
    return [MooncakeRecord(0.0, 8 * BS, 4, (1, 2, 3, 4, 5, 6, 7, 8)),
            MooncakeRecord(gap_s * 1000, 8 * BS, 4, (1, 2, 3, 4, 5, 6, 90, 91))]


def test_peer_pull_brings_the_holders_prefix_and_counts_it_as_pulled():
    # round_robin sends the second request away from the replica holding its prefix
    run = _run(_shared_prefix(), _config(num_replicas=2, peer_pulls=True), policy="round_robin")
    first, second = run.requests
    assert (first.replica_id, second.replica_id) == ("0", "1") and second.pull_from == "0"
    assert second.num_transferred_tokens == 6 * BS and second.num_cached_tokens == 6 * BS
    from kvmesh.cluster.measure.sim.transfer_report import transfer_summary

    summary = transfer_summary(run)
    assert summary["peer_pulls"] == 1 and summary["pulled_tokens"] == 6 * BS
    assert summary["kv_bytes_moved"] == 6 * BS * run.router.config.kv_bytes_per_token
    # the pulled blocks are now the puller's too: its events reached the router's index
    keys = run.router.router.hasher.keys(_tokens(second), None, None)
    assert run.router.index.match(keys).get("1", 0) >= 6


def _tokens(req) -> list[int]:
    return BlockTokenCache(BS, 256, 0).prompt(req.hash_ids, req.num_prompt_tokens)


def test_peer_pull_happens_only_when_cheaper_than_recomputing():
    slow = _config(num_replicas=2, peer_pulls=True, kv_transfer_bytes_per_s=1e6)  # 131 ms per token moved
    run = _run(_shared_prefix(), slow, policy="round_robin")
    second = run.requests[1]
    assert second.pull_from is None and second.num_transferred_tokens == 0 and second.num_cached_tokens == 0
    # the router's price: bytes / the measured pull rate + the pull's measured fixed cost (the replicas report
    # kv_transfer_latency_s) against tokens / prefill rate
    one_block = [MooncakeRecord(0.0, 2 * BS, 4, (1, 2)), MooncakeRecord(10_000.0, 2 * BS, 4, (1, 3))]
    for latency_s, pulled in ((0.01, False), (0.001, True)):
        run = _run(one_block, _config(num_replicas=2, peer_pulls=True, kv_transfer_latency_s=latency_s),
                   policy="round_robin")
        config = run.router.config  # one block: 0.037 s to move + the fixed cost against 0.043 s to compute
        move_s = BS * config.kv_bytes_per_token / config.kv_transfer_bytes_per_s + latency_s
        assert (move_s < BS * config.cost.prefill_s_per_token) == pulled
        assert (run.requests[1].pull_from == "0") == pulled and (run.requests[1].num_cached_tokens > 0) == pulled


def test_a_prompt_the_split_skips_for_want_of_room_can_still_pull_its_prefix():
    records = [MooncakeRecord(0.0, 8 * BS, 4, tuple(range(1, 9))),  # A: split, its prefix ends on decode replica 0
               MooncakeRecord(1000.0, 36 * BS, 4, tuple(range(100, 136))),  # X: fills the prefill replica's backlog
               MooncakeRecord(1100.0, 32, 4, (300,)),  # Y: short, whole (round_robin's turn)
               MooncakeRecord(1200.0, 8 * BS, 4, (*range(1, 8), 400))]  # B: A's 7-block prefix, on replica 1
    # the room bound alone (in seconds, A would stay whole too)
    token_rules = RouterConfig(transfers=KVPlacementRules(pd_ttft_slack_s=None))
    run = _run(records, _config(num_replicas=2, num_prefill_replicas=1, peer_pulls=True, router=token_rules),
               policy="round_robin")
    a, x, _, b = run.requests
    assert a.prefill_leg is not None and x.prefill_leg is not None and a.replica_id == "0" and b.replica_id == "1"
    assert b.prefill_leg is None and run.router.splits_skipped_no_room == 1
    assert b.pull_from in ("0", "2") and b.num_transferred_tokens == 7 * BS


def test_without_peer_pulls_the_second_request_recomputes_its_prefix():
    run = _run(_shared_prefix(), _config(num_replicas=2), policy="round_robin")
    assert run.requests[1].num_cached_tokens == 0 and run.requests[1].pull_from is None


def test_pd_comparison_report_sets_the_four_runs_side_by_side():
    config = _config(num_replicas=3, num_prefill_replicas=1)
    report = compare_policies(_long_and_chatty(n=120), config, ["cache_aware"], show_progress=False,
                              with_ceilings=False, variants=kv_transfer_variants(config))
    assert list(report["policies"]) == ["cache_aware/both", "cache_aware/both+pulls", "cache_aware/pd 1p3d",
                                        "cache_aware/pd 1p3d+pulls"]
    both, split = report["policies"]["cache_aware/both"], report["policies"]["cache_aware/pd 1p3d"]
    assert both["transfers"]["num_prefill_replicas"] == 0 and both["transfers"]["splits"] == 0
    assert split["transfers"]["num_prefill_replicas"] == 1 and split["transfers"]["splits"] > 0
    for key in ("split_tokens_moved", "pulled_tokens", "pulled_hit_rate", "kv_bytes_moved", "ttft_split_s",
                "inter_token_s", "decode_load_imbalance", "splits_skipped_no_room"):
        assert key in split["transfers"], key
    assert {"p50", "p99", "p99.9", "mean"} <= set(split["transfers"]["inter_token_s"])
    assert split["transfers"]["ttft_split_s"]["p50"] > 0
    table = format_table(report)
    assert "KV transfers" in table and "cache_aware/pd 1p3d+pulls" in table
    json.dumps(report)  # JSON-ready


def test_pd_compare_keeps_the_total_and_needs_a_decode_replica():
    assert kv_transfer_variants(_config(num_replicas=4))["/pd 1p3d"] == {
        "num_replicas": 3, "num_prefill_replicas": 1, "peer_pulls": False}
    with pytest.raises(ValueError, match="needs a decode replica"):
        kv_transfer_variants(_config(num_replicas=1))


@pytest.mark.parametrize(("field", "value", "message"), [
    ("num_prefill_replicas", -1, "num_prefill_replicas must be >= 0"),
    ("kv_transfer_bytes_per_s", 0.0, "kv_transfer_bytes_per_s must be > 0"),
    ("kv_transfer_latency_s", -1.0, "kv_transfer_latency_s must be >= 0"),
    ("kv_bytes_per_token", 0, "kv_bytes_per_token must be >= 1"),
    ("pd_prefill_pick", "nearest", "pd_prefill_pick must be one of least_loaded, policy"),
])
def test_bad_transfer_settings_are_clear_errors(field, value, message):
    with pytest.raises(ValueError, match=message):
        SimConfig(**{field: value})


def test_the_routers_token_thresholds_shrink_with_a_miniature():
    from kvmesh.cluster.measure.sim.config import miniature

    small = miniature(SimConfig(), 8).router.transfers
    assert small.pd_min_uncached_tokens == KVPlacementRules().pd_min_uncached_tokens // 8
    assert small.pd_max_prefill_backlog_tokens == KVPlacementRules().pd_max_prefill_backlog_tokens // 8


def test_sim_cli_pd_compare_writes_the_transfer_plot(mooncake_trace, tmp_path, capsys):
    out = tmp_path / "pd.json"
    rc = main(["sim", "--trace", str(mooncake_trace), "--start", "3800", "--limit", "80", "--max-prompt-blocks", "16",
               "--num-replicas", "3", "--num-prefill-replicas", "1", "--pd-compare", "--policies", "cache_aware",
               "--miniature", "8", "--out", str(out), "--no-progress"])
    assert rc == 0
    report = json.loads(out.read_text())
    assert len(report["policies"]) == 4
    assert (tmp_path / "pd_kv_transfer.png").stat().st_size > 1000
    assert "KV transfers" in capsys.readouterr().out


def test_sim_cli_rejects_a_negative_prefill_count(mooncake_trace, tmp_path, capsys):
    rc = main(["sim", "--trace", str(mooncake_trace), "--limit", "5", "--num-prefill-replicas", "-1",
               "--out", str(tmp_path / "o.json"), "--no-progress"])
    assert rc == 2
    assert "num_prefill_replicas must be >= 0" in capsys.readouterr().err


def test_every_policys_pulls_move_what_their_holder_holds(tmp_path):
    """Tool agents at 2x with 25 GB/s pulls: a turn queued on a replica leaves it credited with a context not computed
    yet, and a pull of that context would move nothing. The router plans every policy's pulls from the blocks a
    holder's events confirmed: each moves something."""
    out = tmp_path / "pulls.json"
    rc = main(["sim", "--workload", "tool_agent", "--num-replicas", "16", "--time-scale", "0.5", "--arrival-seed", "0",
               "--policies", "cache_aware_tokens,dynamo,llmd", "--peer-pulls", "--kv-transfer-bytes-per-s", "25e9",
               "--no-plot", "--no-progress", "--no-ceilings", "--out", str(out)])
    assert rc == 0
    for name, p in json.loads(out.read_text())["policies"].items():
        moved = p["transfers"]
        assert moved["peer_pulls"] > 0 and moved["peer_pulls_nothing_to_move"] == 0, (name, moved)
