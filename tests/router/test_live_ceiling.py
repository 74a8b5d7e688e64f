"""The router's live single-pool ceiling (router/routing/ceiling.py): the ghost pool on hand-computed cases, the
misses by kind, and its estimate against ``kvmesh sim``'s single-pool ceiling of the same trace and capacity."""

from __future__ import annotations

import time

import pytest
from kvmesh.router.routing.ceiling import LiveCeiling, classify_misses


def test_misses_are_classified_once_each_in_order():
    assert classify_misses(100, cached=20, predicted=40, best=60, seen=80) == {
        "stale_index": 20, "routed_away": 20, "evicted": 20, "no_reuse": 20}
    # a hit above the prediction (a luckier pool) leaves nothing to the kinds below it
    assert classify_misses(100, cached=50, predicted=40, best=30, seen=0) == {
        "stale_index": 0, "routed_away": 0, "evicted": 0, "no_reuse": 50}


def test_the_ghost_pool_hits_evicts_and_remembers_what_it_evicted():
    c = LiveCeiling(block_size=4, capacity_blocks=lambda: 4)
    c.observe([1, 2], 8, 0, 0, 0, 0)  # cold: both blocks stored, block 1 most recent
    assert c.totals.ceiling_tokens == 0
    c.observe([1, 2], 8, 0, 4, 4, 4)  # one block reusable (the last token's is computed): 4 tokens
    assert (c.totals.ceiling_tokens, c.totals.hit_tokens) == (4, 4)
    # 12 + 4 tokens hold 4 blocks: the pool of 4 evicts everything else
    c.observe([3, 4, 5], 12, 4, 0, 0, 0)
    assert c.totals.ceiling_tokens == 4
    assert list(c._ghost)[1:] == [5, 4, 3]  # a blank for the output block, then the prompt tail first
    c.observe([1, 2], 8, 0, 0, 0, 0)  # gone from the pool, seen before: evicted, not no reuse
    assert c.totals.ceiling_tokens == 4
    assert c.totals.misses == {"stale_index": 0, "routed_away": 0, "evicted": 4, "no_reuse": 8 + 4 + 12 + 4}
    assert c.totals.prompt_tokens == 36 and c.totals.share == 1.0


def test_nothing_is_counted_before_the_fleet_reports_its_blocks():
    c = LiveCeiling(block_size=4, capacity_blocks=lambda: 0)
    c.observe([1, 2], 8, 0, 4, 4, 4)
    assert c.totals.requests == 0


def test_the_ghost_holds_at_most_the_fleets_blocks():
    c = LiveCeiling(block_size=4, capacity_blocks=lambda: 64)
    for i in range(200):
        c.observe([1000 * i + j for j in range(8)], 32, 16, 0, 0, 0)
    assert len(c._ghost) <= 64 and len(c._evicted) <= 64


def test_the_replay_costs_little_per_request():
    """Off the request's path, but on the router's loop: a 2,048-token prompt's replay in well under 1 ms of CPU
    (this thread's: a loaded machine stretches the wall clock, 1.4 ms a replay at a load of 20 on 2 cores)."""
    c = LiveCeiling(block_size=16, capacity_blocks=lambda: 20_000)
    keys = [[(i % 50) * 10_000 + j for j in range(128)] for i in range(2000)]
    t0 = time.thread_time()
    for k in keys:
        c.observe(k, 2048, 128, 0, 0, 0)
    per_request = (time.thread_time() - t0) / len(keys)
    assert per_request < 1e-3, f"{1e6 * per_request:.0f} us per request"


@pytest.mark.parametrize("workload", ["mooncake", "azure_conv"])
def test_the_live_estimate_is_within_a_point_of_the_simulators_single_pool_ceiling(workload):
    """A trace through the simulator's routers (the real KVRouter): the ceiling they estimate from what they
    routed against ``kvmesh sim``'s single pool (one real KVCacheManager of the same blocks)."""
    from kvmesh.cluster.measure.sim.config import SimConfig
    from kvmesh.cluster.measure.sim.run import compare_policies
    from kvmesh.cluster.measure.workloads.registry import get_workload
    from kvmesh.cluster.measure.workloads.settings import WorkloadSettings

    records = get_workload(workload).make(WorkloadSettings(trace_limit=2000))
    report = compare_policies(records, SimConfig(num_replicas=4, time_scale=0.5), ["cache_aware_tokens"],
                              show_progress=False)
    live = report["policies"]["cache_aware_tokens"]["live_ceiling"]
    pool = report["ceilings"]["single_pool_hit_rate"]
    assert live["requests"] == 2000 and live["capacity_blocks"] == report["total_blocks"]
    assert abs(live["ceiling_hit_rate"] - pool) < 0.01, (live, pool)
    assert live["ceiling_hit_rate"] > 0.1  # a ceiling with reuse in it, not two zeros agreeing
    hit = report["policies"]["cache_aware_tokens"]["cached_tokens"]
    assert sum(live["miss_tokens"].values()) == live["prompt_tokens"] - live["hit_tokens"]
    assert live["hit_tokens"] == hit


def test_the_router_exports_the_ceiling_on_metrics_and_kvmesh_status_reads_it_back():
    """A KVRouter whose replicas reported their blocks, two answered requests (the second the first's prompt, kept
    off the first's replica), /metrics rendered and read back as ``kvmesh status`` does."""
    from kvmesh.cluster.ceiling_status import ceiling_figures, ceiling_line
    from kvmesh.replica.serving.load_report import LoadReport
    from kvmesh.router.http.receipt_metrics import ReceiptMetrics
    from kvmesh.router.routing.kv_router import KVRouter
    from prometheus_client import CollectorRegistry, generate_latest

    router = KVRouter(block_size=16)
    for rid in ("r0", "r1"):
        router.add_replica(rid)
        router.replicas.get(rid).load.update_report(LoadReport(
            num_requests_running=0, num_requests_waiting=0, kv_cache_usage=0.0, num_waiting_prefill_tokens=0,
            num_kv_blocks=101, block_size=16))
    registry = CollectorRegistry()
    ReceiptMetrics(registry, router.receipts)
    assert ceiling_figures(generate_latest(registry).decode()) is None  # nothing replayed yet
    prompt = list(range(64))
    first = router.route(prompt)
    router.receipts.record_actual(first.receipt, 0, keys=first.keys, output_tokens=16)
    second = router.route(prompt, exclude=[first.replica_id])
    router.receipts.record_actual(second.receipt, 0, keys=second.keys, output_tokens=16)
    figures = ceiling_figures(generate_latest(registry).decode())
    assert figures["blocks"] == 200 and figures["prompt"] == 128
    assert figures["ceiling"] == 48 and figures["hit"] == 0  # the single pool: 3 of the 4 blocks on the second
    # the second's blocks were seen, and no candidate offered them (the first replica was excluded): evicted
    assert figures["misses"] == {"stale_index": 0, "routed_away": 0, "evicted": 48, "no_reuse": 80}
    assert ceiling_line(figures).splitlines()[0] == (
        "single pool: hits 0.0% of the ceiling (one pool of 200 blocks: 37.5% of 128 prompt tokens);")


def _runtime():
    """What route_accounting reads of a running router: a KVRouter of two replicas that reported 101 blocks each."""
    from types import SimpleNamespace

    from kvmesh.replica.serving.load_report import LoadReport
    from kvmesh.router.config import RouterConfig
    from kvmesh.router.http.metrics import RouterMetrics
    from kvmesh.router.http.receipt_metrics import ReceiptMetrics
    from kvmesh.router.routing.kv_router import KVRouter

    router = KVRouter(block_size=16)
    for rid in ("r0", "r1"):
        router.add_replica(rid)
        router.replicas.get(rid).load.update_report(LoadReport(
            num_requests_running=0, num_requests_waiting=0, kv_cache_usage=0.0, num_waiting_prefill_tokens=0,
            num_kv_blocks=101, block_size=16))
    metrics = RouterMetrics()
    return SimpleNamespace(config=RouterConfig(), router=router, metrics=metrics,
                           receipt_metrics=ReceiptMetrics(metrics.registry, router.receipts))


USAGE = b'{"usage": {"prompt_tokens": 64, "completion_tokens": 40, "prompt_tokens_details": {"cached_tokens": 0}}}'


def test_an_answer_is_replayed_after_its_usage_chunk_leaves_with_its_output_blocks():
    import asyncio

    from kvmesh.router.http.route_accounting import report_cached

    runtime = _runtime()
    decision = runtime.router.route(list(range(64)))

    async def answer() -> int:
        report_cached(runtime, decision, USAGE)
        before = runtime.router.receipts.ceiling.totals.requests  # not yet: scheduled after this chunk
        await asyncio.sleep(0)
        return before

    assert asyncio.run(answer()) == 0
    ceiling = runtime.router.receipts.ceiling
    assert ceiling.totals.requests == 1 and ceiling.totals.prompt_tokens == 64
    assert len(ceiling._ghost) == 7  # ceil((64 + 40) / 16) blocks: 4 of the prompt, 3 blanks of the output
    report_cached(runtime, runtime.router.route(list(range(64))), USAGE)  # outside a loop: replayed at once
    assert ceiling.totals.requests == 2 and ceiling.totals.ceiling_tokens == 48
