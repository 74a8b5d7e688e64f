"""On a real Ray (the session's: 8 CPUs, no GPU), asking for more GPUs than there are never hangs: serve
refuses before it places anything, and a wait it was told to allow ends at ray.placement_timeout_s with
progress meanwhile and nothing left holding resources."""

from __future__ import annotations

import os
import re
import time

import pytest
from kvmesh.cluster.config.loader import from_dict
from kvmesh.cluster.launch.capacity import CapacityError
from kvmesh.cluster.launch.launcher import ServeCluster
from kvmesh.cluster.launch.placement import create_placement_groups, remove_placement_groups, wait_ready

pytestmark = pytest.mark.ray


def _gpu_config(model, **ray_settings):
    return from_dict({
        "engine": {"model": str(model), "device": "cuda"},
        "replicas": {"num_replicas": 3, "http_port": 0, "event_port": 0},
        "router": {"port": 0},
        "ray": {"namespace": f"kvmesh-placement-{os.getpid()}", **ray_settings},
    })


def _live(groups) -> list[str]:
    """The ones of ``groups`` (ReplicaPlacement) Ray still holds."""
    import ray

    table = ray.util.placement_group_table()
    ids = {g.placement_group.id.hex() for g in groups}
    return [g["name"] for pg_id, g in table.items() if pg_id in ids and g["state"] != "REMOVED"]


def test_serve_asking_for_gpus_the_cluster_lacks_fails_at_once(ray_session, stories_path):
    messages: list[str] = []
    cluster = ServeCluster(_gpu_config(stories_path), report=messages.append)
    started = time.monotonic()
    try:
        with pytest.raises(CapacityError, match=r"^3 replicas x 1 GPU need 3 GPUs.*the cluster has 0 GPUs"):
            cluster.start()
        assert time.monotonic() - started < 30  # the old behaviour: 300 s of silence
        assert not cluster.state.groups and not any("placing" in m for m in messages)
    finally:
        cluster.stop()


def test_a_wait_for_nodes_that_never_come_ends_at_the_placement_timeout(ray_session, stories_path):
    messages: list[str] = []
    cluster = ServeCluster(_gpu_config(stories_path, wait_for_nodes=True, placement_timeout_s=2),
                           report=messages.append)
    started = time.monotonic()
    try:
        with pytest.raises(TimeoutError, match=r"could not be placed within 2s \(ray.placement_timeout_s\)"):
            cluster.start()
        assert time.monotonic() - started < 30
        note = next(m for m in messages if "cannot hold the replicas yet" in m)
        assert "yet: 3 replicas x 1 GPU need 3 GPUs" in note and note.endswith("waiting up to 2s for the Ray "
                                                                               "autoscaler to add nodes")
        groups = list(cluster.state.groups)
        assert len(groups) == 3 and len(_live(groups)) == 3
    finally:
        cluster.stop()
    assert not _live(groups)


def test_waiting_for_placement_reports_progress(ray_session):
    groups = create_placement_groups(1, [{"CPU": 1.0, "GPU": 1.0}], "spread", name_prefix="kvmesh-progress")
    notes: list[str] = []
    try:
        with pytest.raises(TimeoutError, match="each needs"):
            wait_ready(groups, timeout_s=2.5, report=notes.append, note_every_s=10, first_note_s=0.5)
    finally:
        remove_placement_groups(groups)
    assert len(notes) == 1  # the first note comes early, the next only after note_every_s
    assert re.match(r"waiting for Ray to place 1 of 1 replica\(s\) \[[12]s of 2.5s\]; free now: \S", notes[0]), notes
    assert not _live(groups)


def test_two_clusters_on_one_ray_place_their_replicas_side_by_side(ray_session):
    """Ray refuses a second placement group of a name: a second cluster on the same Ray (a serve joining it, an
    in-process test cluster) must not reuse the first one's names."""
    first = create_placement_groups(1, [{"CPU": 0.5}], "spread")
    try:
        second = create_placement_groups(1, [{"CPU": 0.5}], "spread")
        try:
            wait_ready(first + second, timeout_s=60)
            assert len(_live(first + second)) == 2
        finally:
            remove_placement_groups(second)
    finally:
        remove_placement_groups(first)
