"""`kvmesh status` reads the router's real /metrics text into per-replica rows."""

from __future__ import annotations

from kvmesh.cluster.commands.status import format_table
from kvmesh.cluster.router_client import ReplicaStatus, apply_metrics
from kvmesh.router.http.metrics import RouterMetrics
from kvmesh.router.replicas.replica import READY, Replica
from kvmesh.router.routing.load import LoadTracker


def _router_metrics_text() -> str:
    loads = LoadTracker()
    for rid in ("replica-0", "replica-1"):
        loads.replicas.add(Replica(rid, healthy=True, state=READY))
    state = {
        "index_blocks": {"replica-0": 12, "replica-1": 3}, "index_keys": 15, "events_applied": 40,
        "index": {"orphan_blocks": 0, "unknown_removals": 0},
        "healthy": {"replica-0": True, "replica-1": False}, "loads": dict(loads.loads),
        "subscriber": {"replica-0": {"batches": 5, "gaps": 1, "restarts": 2, "last_seq": 4}},
        "event_lag": {"replica-0": 0.002},  # replica-1 has applied no batch yet
    }
    metrics = RouterMetrics(lambda: state)
    metrics.prompt_tokens.labels("replica-0").inc(200)
    metrics.reported_cached_tokens.labels("replica-0").inc(150)
    metrics.decisions.labels("replica-0", "cache_aware").inc(4)
    return metrics.render().decode()


def test_metrics_fill_rows_per_replica():
    rows = {rid: ReplicaStatus(replica_id=rid) for rid in ("replica-0", "replica-1")}
    apply_metrics(rows, _router_metrics_text())
    r0, r1 = rows["replica-0"], rows["replica-1"]
    assert r0.index_blocks == 12 and r1.index_blocks == 3
    assert r0.requests_routed == 4 and r0.hit_rate == 0.75 and r1.hit_rate is None
    assert r0.event_gaps == 1 and r0.event_restarts == 2
    assert abs(r0.event_lag_s - 0.002) < 1e-9
    assert r1.event_lag_s is None  # no batch applied yet: no lag to show


def test_table_lists_health_hit_rate_and_lag():
    rows = [ReplicaStatus("replica-0", url="http://127.0.0.1:1", healthy=True, prompt_tokens=10, cached_tokens=5,
                          event_lag_s=0.0015),
            ReplicaStatus("replica-1", url="http://127.0.0.1:2", healthy=False)]
    table = format_table(rows, "http://127.0.0.1:8000", {"healthy_replicas": ["replica-0"]})
    assert "1/2 replicas healthy" in table
    assert "DOWN" in table and "50%" in table and "1.5 ms" in table


def test_a_replica_the_router_no_longer_has_gets_no_ghost_row():
    rows = {"replica-1": ReplicaStatus(replica_id="replica-1")}  # /replicas lists only replica-1 now
    apply_metrics(rows, _router_metrics_text())  # replica-0's counters outlive its removal
    assert list(rows) == ["replica-1"]


def test_a_degraded_replica_and_its_bad_frames_are_shown():
    loads = LoadTracker()
    loads.replicas.add(Replica("replica-0", healthy=True, state=READY))
    state = {"index_blocks": {"replica-0": 1}, "index_keys": 1, "events_applied": 1,
             "index": {"orphan_blocks": 0, "unknown_removals": 0}, "healthy": {"replica-0": True},
             "loads": dict(loads.loads), "subscriber": {"replica-0": {"bad_frames": 7, "last_seq": 3}},
             "event_lag": {}, "degraded": {"replica-0": {"bad_frames": "20 bad frames within 10s"}}}
    rows = {"replica-0": ReplicaStatus("replica-0", url="http://127.0.0.1:1", healthy=True,
                                       degraded="20 bad frames within 10s")}
    apply_metrics(rows, RouterMetrics(lambda: state).render().decode())
    assert rows["replica-0"].event_bad_frames == 7
    table = format_table(list(rows.values()), "http://127.0.0.1:8000", {"healthy_replicas": ["replica-0"]})
    assert "degraded" in table and "BAD FRAMES" in table
    assert "routed by load only -- 20 bad frames within 10s" in table


def test_a_replica_with_a_host_tier_shows_its_usage_and_host_hit_rate():
    from kvmesh.replica.serving.load_report import LoadReport
    from kvmesh.router.http.receipt_metrics import ReceiptMetrics
    from kvmesh.router.routing.receipts import Receipts, RouteReceipt

    loads = LoadTracker()
    loads.replicas.add(Replica("replica-0", healthy=True, state=READY)).load.update_report(LoadReport(
        num_requests_running=0, num_requests_waiting=0, kv_cache_usage=0.5, num_waiting_prefill_tokens=0,
        num_host_kv_blocks=4096, host_kv_cache_usage=0.25))
    loads.replicas.add(Replica("replica-1", healthy=True, state=READY))
    state = {"index_blocks": {}, "index_keys": 0, "events_applied": 0, "subscriber": {},
             "index": {"orphan_blocks": 0, "unknown_removals": 0},
             "healthy": {"replica-0": True, "replica-1": True}, "loads": dict(loads.loads), "event_lag": {}}
    metrics = RouterMetrics(lambda: state)
    metrics.prompt_tokens.labels("replica-0").inc(400)
    receipts = Receipts()
    receipt = RouteReceipt("replica-0", "cache", 320, 320, "replica-0", 400, predicted_host_tokens=100)
    ReceiptMetrics(metrics.registry, receipts).on_actual(receipts.record_actual(receipt, 320, 100))
    rows = {rid: ReplicaStatus(replica_id=rid) for rid in ("replica-0", "replica-1")}
    apply_metrics(rows, metrics.render().decode())
    assert rows["replica-0"].host_kv_usage == 0.25 and rows["replica-0"].host_hit_rate == 0.25
    assert rows["replica-1"].host_hit_rate is None  # no tier
    table = format_table(list(rows.values()), "http://router", {"healthy_replicas": ["replica-0", "replica-1"]})
    assert "HOST USE" in table and "HOST HIT" in table
    line0 = next(line for line in table.splitlines() if line.startswith("replica-0"))
    assert "25%" in line0


def _replica_kv_transfer_text(ok: int, failed: int, tokens: int, nbytes: int) -> str:
    """A replica's /metrics with its real KV transfer metrics (replica/server/kv_metrics.py) after some pulls."""
    from kvmesh.replica.server.kv_metrics import KVTransferMetrics
    from prometheus_client import CollectorRegistry, Counter, generate_latest

    registry = CollectorRegistry()
    metrics = KVTransferMetrics(registry, lambda: (0, 2, 1))  # leases: 0 active, 2 released, 1 expired
    for _ in range(ok):
        metrics.record_pull("ok", tokens // ok, nbytes // ok, 0.01)
    for _ in range(failed):
        metrics.record_pull("failed", 0, 0, 0.01)
    metrics.record_pull("skipped", 0, 0, 0.0)
    Counter("vllm:prefix_cache_queries", "q", registry=registry).inc(100)
    return generate_latest(registry).decode()


def test_roles_pulls_and_bytes_moved_per_replica_and_a_dash_where_a_replica_has_no_transfer():
    from kvmesh.cluster.replica_status import apply_replica_metrics

    decode = ReplicaStatus("replica-0", role="decode", healthy=True)
    prefill = ReplicaStatus("prefill-1", role="prefill", healthy=True)
    old = ReplicaStatus("replica-2", healthy=True)  # a router that does not say roles, a replica without transfer
    apply_replica_metrics(decode, _replica_kv_transfer_text(ok=3, failed=1, tokens=1200, nbytes=3 * 1024 * 1024))
    apply_replica_metrics(old, "vllm:prefix_cache_queries_total 10\n")
    assert (decode.kv_pulls, decode.kv_pulls_failed, decode.kv_pulled_tokens, decode.kv_leases) == (3, 1, 1200, 3)
    assert old.kv_pulls is None and old.prefix_cache_queries == 10
    table = format_table([decode, prefill, old], "http://router", {"healthy_replicas": ["replica-0"]})
    header, *lines = table.splitlines()[1:]
    assert header.split()[:3] == ["REPLICA", "ROLE", "HEALTH"] and "PULLS" in header and "MOVED" in header
    cells = {line.split()[0]: line.split() for line in lines}
    assert cells["replica-0"][1] == "decode" and "3 (1 failed)" in lines[0] and "3.0 MiB" in lines[0]
    assert cells["prefill-1"][1] == "prefill" and cells["replica-2"][1] == "-"

