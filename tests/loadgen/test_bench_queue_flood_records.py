"""``kvmesh bench queue-flood`` keeps its results file small: the flood's tens of thousands of refusals are counted
in the summary, and only the first of each status stays listed beside every other request."""

from __future__ import annotations

from kvmesh.cluster.measure.benchmarks.queue_flood import kept_records


def test_the_floods_refusals_keep_one_example_per_status_and_everything_else_stays():
    records = ([{"cls": "flood", "status": 429, "message": f"refused {i}"} for i in range(1000)]
               + [{"cls": "flood", "status": 200}] * 3 + [{"cls": "flood", "status": 503}] * 2
               + [{"cls": "light", "status": 429}] * 2 + [{"cls": "light", "status": 200}] * 5
               + [{"cls": "warmup", "status": 200}])
    kept = kept_records(records)
    assert [r for r in kept if r["cls"] == "flood" and r["status"] == 429] == [records[0]]
    assert sum(r["cls"] == "flood" and r["status"] == 503 for r in kept) == 1
    assert sum(r["cls"] == "flood" and r["status"] == 200 for r in kept) == 3
    assert [r for r in kept if r["cls"] != "flood"] == [r for r in records if r["cls"] != "flood"]
