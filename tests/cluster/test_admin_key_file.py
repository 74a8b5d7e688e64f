"""Each `kvmesh serve` leaves its own admin key record: private, never overwritten while it runs, found
by `kvmesh scale/drain/rollout` without a flag when one cluster runs, and a clear error when several do."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from kvmesh.cluster.admin_key import find_admin_key, publish, running_clusters, withdraw, write_private

URL_A, URL_B = "http://127.0.0.1:18001", "http://127.0.0.1:18002"

# A second serve process: publishes its own record, then waits to be killed.
OTHER_SERVE = """
import sys, time
from kvmesh.cluster.admin_key import publish
publish(sys.argv[1], "key-of-the-other-cluster", sys.argv[2])
print("published", flush=True)
time.sleep(60)
"""


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    monkeypatch.delenv("KVMESH_ADMIN_KEY", raising=False)
    monkeypatch.delenv("KVMESH_CLUSTERS_DIR", raising=False)


@pytest.fixture
def other_serve(tmp_path):
    """Another process that published a record for URL_B in ``tmp_path`` and still runs."""
    proc = subprocess.Popen([sys.executable, "-c", OTHER_SERVE, URL_B, str(tmp_path)], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "published"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_record_is_private_and_found_without_a_flag_when_one_cluster_runs(tmp_path):
    path = publish(URL_A, "key-a", tmp_path / "clusters")
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
    assert find_admin_key(None, folder=path.parent) == (URL_A, "key-a")


def test_two_clusters_keep_separate_keys_and_several_need_url(tmp_path, other_serve):
    publish(URL_A, "key-a", tmp_path)
    assert find_admin_key(URL_A, folder=tmp_path) == (URL_A, "key-a")
    assert find_admin_key(URL_B + "/", folder=tmp_path) == (URL_B, "key-of-the-other-cluster")
    with pytest.raises(ValueError, match=f"2 kvmesh clusters run here: .*{URL_A}.*{URL_B}.*pick one with --url"):
        find_admin_key(None, folder=tmp_path)


def test_a_running_clusters_record_is_never_overwritten(tmp_path, other_serve):
    with pytest.raises(RuntimeError, match=f"running kvmesh serve \\(pid {other_serve.pid}\\)"):
        publish(URL_B, "key-of-a-newcomer", tmp_path)
    assert find_admin_key(URL_B, folder=tmp_path)[1] == "key-of-the-other-cluster"


def test_a_dead_clusters_record_is_dropped_and_its_port_can_be_reused(tmp_path, other_serve):
    other_serve.kill()
    other_serve.wait()
    assert running_clusters(tmp_path) == []
    assert not list(tmp_path.glob("*.json"))  # removed: a killed serve could not remove it itself
    publish(URL_B, "key-b", tmp_path)
    assert find_admin_key(None, folder=tmp_path) == (URL_B, "key-b")


def test_clean_shutdown_removes_only_its_own_record(tmp_path, other_serve):
    mine = publish(URL_A, "key-a", tmp_path)
    withdraw(mine)
    withdraw(tmp_path / "127.0.0.1_18002.json")  # the other cluster's: not ours to remove
    assert not mine.exists()
    assert [r.url for r in running_clusters(tmp_path)] == [URL_B]


def test_no_cluster_and_unknown_url_say_what_to_do(tmp_path):
    with pytest.raises(ValueError, match=f"no running kvmesh serve found .*{tmp_path}.*KVMESH_ADMIN_KEY"):
        find_admin_key(None, folder=tmp_path)
    publish(URL_A, "key-a", tmp_path)
    with pytest.raises(ValueError, match=f"no running kvmesh serve with its router at {URL_B}.*running here: {URL_A}"):
        find_admin_key(URL_B, folder=tmp_path)


def test_admin_key_file_holds_a_record_or_just_the_key(tmp_path):
    plain = write_private(tmp_path / "plain", "just-the-key")
    assert find_admin_key(URL_B, str(plain), folder=tmp_path / "none") == (URL_B, "just-the-key")
    record = publish(URL_A, "key-a", tmp_path / "clusters")
    assert find_admin_key(None, str(record), folder=tmp_path / "none") == (URL_A, "key-a")
    os.chmod(plain, 0o644)
    with pytest.raises(ValueError, match="readable by other users.*chmod 600"):
        find_admin_key(None, str(plain))
    with pytest.raises(ValueError, match=f"no admin key at {tmp_path / 'missing'}"):
        find_admin_key(None, str(tmp_path / "missing"))


def test_environment_wins_and_moves_the_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("KVMESH_CLUSTERS_DIR", str(tmp_path))
    publish(URL_A, "key-a", None)
    assert json.loads((tmp_path / "127.0.0.1_18001.json").read_text())["url"] == URL_A
    monkeypatch.setenv("KVMESH_ADMIN_KEY", "from-env-key")
    assert find_admin_key(None) == ("http://127.0.0.1:8000", "from-env-key")
