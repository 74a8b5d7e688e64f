"""Route receipts: what the router predicted, the best any replica offered, why, and what the
engine then found -- checked against real ``kvcache`` pools whose events feed the router."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pytest
from kvmesh.kvcache.kv_cache_manager import KVCacheManager
from kvmesh.router.routing.kv_router import KVRouter
from kvmesh.router.routing.policies import get_policy
from kvmesh.router.routing.receipts import (
    HEADER_BEST,
    HEADER_PREDICTED,
    HEADER_REASON,
    Receipts,
    RouteReceipt,
)

BS = 16


@dataclass(eq=False)
class Req:
    """The request interface ``KVCacheManager`` reads."""

    request_id: str
    all_token_ids: list[int]
    num_computed_tokens: int = 0
    cache_salt: str | None = None
    lora_name: str | None = None
    lora_identity: str | None = None
    skip_reading_prefix_cache: bool = False
    extra: dict = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)


class Replica:
    """A real KV cache manager whose events go straight into the router's index."""

    def __init__(self, rid: str, router: KVRouter, num_blocks: int = 64) -> None:
        self.rid, self.router, self.events = rid, router, []
        self.kv = KVCacheManager(num_blocks + 1, BS, b"\1" * 32, event_sink=self.events.append)
        router.add_replica(rid)

    def serve(self, req: Req) -> int:
        """Admit, compute and free ``req``; returns the cached tokens the engine found."""
        blocks, cached = self.kv.get_computed_blocks(req)
        assert self.kv.allocate_slots(req, req.num_tokens - cached, cached, blocks) is not None
        self.kv.free(req)
        self.router.apply_events(self.rid, self.events[:])
        self.events.clear()
        return cached


def prompt(prefix: int, n_blocks: int, tail: int = 5) -> list[int]:
    return [3 + (prefix * 7 + i) % 250 for i in range(n_blocks * BS)] + [1] * tail


@pytest.fixture
def cluster():
    router = KVRouter(block_size=BS, policy=get_policy("cache_aware", block_size=BS))
    return router, {rid: Replica(rid, router) for rid in ("r0", "r1", "r2")}


_ids = itertools.count()


def route_and_serve(router, replicas, ids, **kw):
    decision = router.route(ids, **kw)
    cached = replicas[decision.replica_id].serve(Req(f"q{next(_ids)}", ids))
    router.receipts.record_actual(decision.receipt, cached)
    return decision.receipt


def test_receipt_prediction_equals_engine_cached_tokens(cluster):
    router, replicas = cluster
    first = route_and_serve(router, replicas, prompt(1, 8))
    assert (first.reason, first.predicted_hit_tokens, first.actual_cached_tokens) == ("load", 0, 0)
    again = route_and_serve(router, replicas, prompt(1, 8, tail=9))
    assert again.reason == "cache" and again.replica_id == first.replica_id
    assert again.predicted_hit_tokens == again.actual_cached_tokens == 8 * BS
    assert again.best_hit_tokens == 8 * BS and again.best_replica_id == first.replica_id
    total = router.receipts.total
    assert total.mispredicted == 0 and total.captured_ratio == 1.0


def test_receipt_records_a_load_diversion_and_the_reuse_it_gave_up(cluster):
    router, replicas = cluster
    home = route_and_serve(router, replicas, prompt(2, 8)).replica_id
    router.loads.loads[home].queued_prefill_tokens = 1_000_000  # the replica holding the prefix is swamped
    diverted = route_and_serve(router, replicas, prompt(2, 8, tail=3))
    assert diverted.reason == "load" and diverted.replica_id != home
    assert diverted.best_replica_id == home and diverted.diverted_tokens == 8 * BS
    summary = router.receipts.summary()
    assert summary["cluster"]["available_tokens"] == 8 * BS and summary["cluster"]["captured_tokens"] == 0
    assert summary["cluster"]["captured_ratio"] == 0.0
    assert summary["cluster"]["reasons"]["load"] == 2 and summary["replicas"][diverted.replica_id]["requests"] == 1


def test_stale_index_shows_as_predicted_not_equal_actual(cluster):
    router, replicas = cluster
    home = route_and_serve(router, replicas, prompt(3, 8)).replica_id
    replicas[home].kv.reset_prefix_cache()  # the replica drops its cache; the router has not heard yet
    replicas[home].events.clear()
    stale = route_and_serve(router, replicas, prompt(3, 8, tail=2))
    assert stale.predicted_hit_tokens == 8 * BS and stale.actual_cached_tokens == 0
    assert stale.mispredicted
    assert router.receipts.total.mispredicted_rate == pytest.approx(1 / 2)


def test_retry_and_degraded_replica_are_fallback_with_no_cache_claims(cluster):
    router, replicas = cluster
    home = route_and_serve(router, replicas, prompt(4, 8)).replica_id
    retry = router.route(prompt(4, 8, tail=2), exclude=[home]).receipt
    assert retry.reason == "fallback" and retry.replica_id != home and retry.best_hit_tokens == 0
    for rid in replicas:
        router.set_degraded(router.replicas.get(rid), "block size 32 != router's 16")
    degraded = router.route(prompt(4, 8, tail=4)).receipt
    assert degraded.reason == "fallback" and degraded.predicted_hit_tokens == degraded.best_hit_tokens == 0
    router.set_degraded(router.replicas.get(home), None)
    assert router.route(prompt(4, 8, tail=6)).receipt.replica_id == home


def test_receipt_headers_and_log_fields_carry_the_decision():
    receipt = RouteReceipt("r7", "cache", 320, 320, "r7", 333, session_id="s1")
    headers = receipt.headers()
    assert headers[HEADER_REASON] == "cache" and headers[HEADER_PREDICTED] == "320" and headers[HEADER_BEST] == "320"
    assert all(name.startswith("x-kvmesh-") for name in headers)
    assert receipt.log_fields()["cached_tokens"] is None and receipt.mispredicted is None
    Receipts().record_actual(receipt, 304)
    assert receipt.log_fields()["cached_tokens"] == 304 and receipt.mispredicted


def test_bad_reason_and_negative_cached_tokens_are_rejected():
    with pytest.raises(ValueError, match="unknown route reason 'luck'"):
        RouteReceipt("r0", "luck", 0, 0, None, 10)
    with pytest.raises(ValueError, match="cached_tokens must be >= 0"):
        Receipts().record_actual(RouteReceipt("r0", "load", 0, 0, None, 10), -1)


def test_receipt_metrics_expose_captured_reuse_and_mispredictions():
    from kvmesh.router.http.receipt_metrics import ReceiptMetrics
    from prometheus_client import CollectorRegistry, generate_latest

    registry, receipts = CollectorRegistry(), Receipts()
    metrics = ReceiptMetrics(registry, receipts)
    for cached in (320, 160):
        receipt = RouteReceipt("r1", "cache", 320, 320, "r1", 400)
        metrics.on_route(receipt)
        metrics.on_actual(receipts.record_actual(receipt, cached))
    text = generate_latest(registry).decode()
    assert 'kvmesh_router_route_decisions_total{reason="cache",replica="r1"} 2.0' in text
    assert 'kvmesh_router_available_hit_tokens_total{replica="r1"} 640.0' in text
    assert 'kvmesh_router_receipt_mispredicted_total{replica="r1"} 1.0' in text
    assert 'kvmesh_router_captured_reuse_ratio{replica=""} 0.75' in text
    assert 'kvmesh_router_mispredicted_ratio{replica="r1"} 0.5' in text
