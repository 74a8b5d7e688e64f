"""The admin key file serve leaves for `kvmesh scale/drain/rollout`: private to its user, clear errors."""

from __future__ import annotations

import os

import pytest
from kvmesh.cluster.admin_key import default_admin_key_file, read_admin_key, write_admin_key


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    monkeypatch.delenv("KVMESH_ADMIN_KEY", raising=False)
    monkeypatch.delenv("KVMESH_ADMIN_KEY_FILE", raising=False)


def test_written_readable_by_its_user_only_and_read_back(tmp_path):
    path = write_admin_key(tmp_path / "kvmesh" / "admin_key", "s3cret-admin-key")
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
    assert read_admin_key(path) == "s3cret-admin-key"
    os.chmod(path, 0o644)  # someone widened it: a rewrite narrows it again
    assert write_admin_key(path, "next-key").stat().st_mode & 0o777 == 0o600
    assert read_admin_key(path) == "next-key"


def test_a_file_others_can_read_is_refused(tmp_path):
    path = write_admin_key(tmp_path / "admin_key", "k" * 20)
    os.chmod(path, 0o640)
    with pytest.raises(ValueError, match="readable by other users.*chmod 600"):
        read_admin_key(path)


def test_missing_file_says_where_it_looked(tmp_path):
    with pytest.raises(ValueError, match=f"no admin key at {tmp_path / 'nope'}.*KVMESH_ADMIN_KEY"):
        read_admin_key(tmp_path / "nope")


def test_environment_wins_and_locates_the_default(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_admin_key_file() == tmp_path / "kvmesh" / "admin_key"
    monkeypatch.setenv("KVMESH_ADMIN_KEY_FILE", str(tmp_path / "elsewhere"))
    assert default_admin_key_file() == tmp_path / "elsewhere"
    monkeypatch.setenv("KVMESH_ADMIN_KEY", "from-env-key")
    assert read_admin_key(tmp_path / "missing") == "from-env-key"
