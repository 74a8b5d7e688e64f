"""Router processes of one host share their in-flight counts (router/routing/shared_loads.py, LoadTracker.share)."""

from __future__ import annotations

import multiprocessing as mp

import pytest
from kvmesh.router.control.workers import MAX_AUTO_WORKERS, spare_cores
from kvmesh.router.replicas.replica import READY, Replica
from kvmesh.router.routing.load import LoadTracker
from kvmesh.router.routing.shared_loads import SharedLoadTable


def _trackers(table: SharedLoadTable, *replicas: str) -> list[LoadTracker]:
    out = []
    for row in range(table.num_rows):
        tracker = LoadTracker()
        for rid in replicas:
            tracker.replicas.add(Replica(rid, healthy=True, state=READY))
        tracker.share(table, row)
        out.append(tracker)
    return out


def test_a_request_sent_by_one_process_counts_in_the_others_load_view():
    a, b = _trackers(SharedLoadTable(2), "r0", "r1")
    a.on_dispatch(a.replicas.get("r1"), 500)
    b.refresh()
    assert (b.loads["r1"].decode_load, b.loads["r1"].prefill_backlog) == (1, 500)
    assert b.loads["r0"].decode_load == 0
    assert b.loads["r1"].in_flight == 0  # b's own count stays b's own
    a.on_first_output(a.replicas.get("r1"), 500)
    b.refresh()
    assert (b.loads["r1"].total_in_flight, b.loads["r1"].prefill_backlog) == (1, 0)
    a.on_finish(a.replicas.get("r1"), 500, had_output=True)
    b.refresh()
    assert b.loads["r1"].total_in_flight == 0


def test_the_policy_sees_the_other_process_requests():
    from kvmesh.router.routing.kv_router import KVRouter
    from kvmesh.router.routing.policies import get_policy

    table = SharedLoadTable(2)
    routers = [KVRouter(block_size=16, policy=get_policy("least_loaded")) for _ in range(2)]
    for row, router in enumerate(routers):
        for rid in ("r0", "r1"):
            router.add_replica(rid)
        router.loads.share(table, row)
    routers[0].loads.on_dispatch(routers[0].loads.replicas.get("r0"), 100)
    routers[0].loads.on_dispatch(routers[0].loads.replicas.get("r0"), 100)
    assert routers[1].route(list(range(64))).replica_id == "r1"


def test_a_reader_without_a_row_sums_every_writer():
    table = SharedLoadTable(3)
    writers = _trackers(table, "r0")
    reader = LoadTracker()
    reader.replicas.add(Replica("r0", healthy=True, state=READY))
    reader.share(table, None)
    for w in writers:
        w.on_dispatch(w.replicas.get("r0"), 10)
    reader.refresh()
    assert (reader.loads["r0"].total_in_flight, reader.loads["r0"].prefill_backlog) == (3, 30)


def test_removing_a_replica_or_clearing_a_dead_process_row_drops_its_counts():
    table = SharedLoadTable(2)
    a, b = _trackers(table, "r0")
    a.on_dispatch(a.replicas.get("r0"), 10)
    a.replicas.remove("r0")
    b.refresh()
    assert b.loads["r0"].total_in_flight == 0
    a.replicas.add(Replica("r0", healthy=True, state=READY))
    a.on_dispatch(a.replicas.get("r0"), 10)
    table.clear_row(0)  # the process holding row 0 died: its requests are gone with it
    b.refresh()
    assert b.loads["r0"].total_in_flight == 0


def test_a_replica_added_after_sharing_or_re_registered_keeps_one_column_for_all():
    table = SharedLoadTable(2)
    a, b = _trackers(table, "r0", "r1")
    a.replicas.remove("r0")
    a.replicas.add(Replica("r2", healthy=True,
                           state=READY))  # a newcomer takes the next free column, not the one r0 left
    a.replicas.add(Replica("r0", healthy=True, state=READY))  # back under its id: its old column
    b.replicas.add(Replica("r2", healthy=True, state=READY))
    a.on_dispatch(a.replicas.get("r0"), 5)
    a.on_dispatch(a.replicas.get("r2"), 3)
    a.on_dispatch(a.replicas.get("r2"), 3)
    b.refresh()
    assert [b.loads[r].total_in_flight for r in ("r0", "r1", "r2")] == [1, 0, 2]
    assert [b.loads[r].prefill_backlog for r in ("r0", "r1", "r2")] == [5, 0, 6]


def test_processes_agree_on_slots_whatever_order_they_see_replicas_in():
    table = SharedLoadTable(2)
    a, b = LoadTracker(), LoadTracker()
    for rid in ("x", "y"):
        a.replicas.add(Replica(rid, healthy=True, state=READY))
    for rid in ("y", "x"):
        b.replicas.add(Replica(rid, healthy=True, state=READY))
    a.share(table, 0)
    b.share(table, 1)
    a.on_dispatch(a.replicas.get("y"), 7)
    b.refresh()
    assert (b.loads["y"].total_in_flight, b.loads["x"].total_in_flight) == (1, 0)


def test_a_full_table_counts_the_extra_replica_locally_only():
    a, b = _trackers(SharedLoadTable(2, max_replicas=1), "r0", "r1")
    a.on_dispatch(a.replicas.get("r1"), 1)
    a.on_dispatch(a.replicas.get("r0"), 1)
    b.refresh()
    assert a.loads["r1"].in_flight == 1
    assert sum(load.total_in_flight for load in b.loads.values()) == 1  # only the replica with a slot


def _write_from_child(table: SharedLoadTable, row: int) -> None:
    tracker = LoadTracker()
    tracker.replicas.add(Replica("replica-7", healthy=True, state=READY))
    tracker.share(table, row)
    tracker.on_dispatch(tracker.replicas.get("replica-7"), 123)


def test_counts_cross_process_boundaries():
    table = SharedLoadTable(2)
    child = mp.get_context("spawn").Process(target=_write_from_child, args=(table, 1))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    reader = LoadTracker()
    reader.replicas.add(Replica("replica-7", healthy=True, state=READY))
    reader.share(table, 0)
    reader.refresh()
    assert (reader.loads["replica-7"].peer_in_flight, reader.loads["replica-7"].prefill_backlog) == (1, 123)


@pytest.mark.parametrize("cores, reserved, expected",
                         [(2, 2, 1), (2, 0, 1), (4, 2, 1), (16, 4, 11), (64, 0, MAX_AUTO_WORKERS)])
def test_auto_workers_are_the_cores_left_after_the_replicas(monkeypatch, cores, reserved, expected):
    monkeypatch.setattr("os.sched_getaffinity", lambda _: set(range(cores)), raising=False)
    assert spare_cores(reserved) == min(expected, MAX_AUTO_WORKERS)


def test_serve_resolves_auto_workers_to_one_on_a_two_core_host(monkeypatch):
    from kvmesh.cluster.config.trees import ServeConfig
    from kvmesh.cluster.launch.serve_router import num_router_workers

    monkeypatch.setattr("os.sched_getaffinity", lambda _: {0, 1}, raising=False)
    assert ServeConfig().router.workers == 0  # auto is serve's default
    assert num_router_workers(ServeConfig()) == 1
