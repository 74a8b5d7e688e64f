"""kvmesh bench faults: how it counts what clients saw (the kill-under-load run itself is in BENCHMARKS.md, "Replicas
killed under load")."""

from __future__ import annotations

from kvmesh.cluster.measure.benchmarks.faults import _metric, summarize

PAGE = """# HELP kvmesh_router_stream_migrations_total Streams continued on another replica
kvmesh_router_stream_migrations_total{replica="replica-0"} 3.0
kvmesh_router_stream_migrations_total{replica="replica-1"} 2.0
kvmesh_router_retries_total{replica="replica-0"} 1.0
kvmesh_router_replica_healthy{replica="replica-0"} 1.0
kvmesh_router_replica_healthy{replica="replica-1"} 0.0
"""


def test_metric_sums_every_labelled_sample():
    assert _metric(PAGE, "kvmesh_router_stream_migrations_total") == 5
    assert _metric(PAGE, "kvmesh_router_replica_healthy") == 1
    assert _metric(PAGE, "kvmesh_router_missing") == 0


def test_failures_are_split_at_the_first_byte_and_inexact_texts_counted():
    results = [
        {"ok": True, "first_byte": True, "exact": True, "error": None},
        {"ok": True, "first_byte": True, "exact": False, "error": None},
        {"ok": False, "first_byte": False, "exact": False, "error": "HTTP 503"},
        {"ok": False, "first_byte": True, "exact": False, "error": "stream ended without [DONE]"},
    ]
    kills = [{"kill": 1, "full_capacity_s": 12.5}, {"kill": 2, "full_capacity_s": None}]
    s = summarize(results, kills, PAGE, wall_s=10.0, cpu_s=0.4)
    assert (s["requests"], s["completed"]) == (4, 2)
    assert (s["failed_before_first_byte"], s["failed_after_first_byte"], s["inexact_text"]) == (1, 1, 1)
    assert (s["stream_migrations"], s["retries_before_first_byte"]) == (5, 1)
    assert (s["full_capacity_s_max"], s["kills_not_restored"]) == (12.5, 1)
    assert s["router_driver_cpu_ms_per_request"] == 100.0
