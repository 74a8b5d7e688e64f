"""`kvmesh drain/scale/rollout` against a standalone router: the admin key from the file, clear errors."""

from __future__ import annotations

import pytest
from kvmesh.cluster.admin_key import write_admin_key
from kvmesh.cluster.cli import main
from kvmesh.cluster.commands.rollout import parse_settings

from .conftest import wait_for


@pytest.fixture
def key_file(tmp_path, monkeypatch):
    monkeypatch.delenv("KVMESH_ADMIN_KEY", raising=False)
    monkeypatch.setenv("KVMESH_API_KEY", "tenant-key")
    return write_admin_key(tmp_path / "admin_key", "admin-key")


def test_drain_command_takes_the_replica_out_of_rotation(fakes, start_router, key_file, capsys):
    router = start_router([fakes[0].spec, fakes[1].spec], api_key="tenant-key", admin_key="admin-key")
    wait_for(lambda: len(router.runtime.router.healthy) == 2, what="both replicas healthy")
    assert main(["drain", "b", "--url", router.url, "--admin-key-file", str(key_file)]) == 0
    assert "'draining': True" in capsys.readouterr().out
    assert router.runtime.draining == {"b"} and router.runtime.router.healthy == {"a"}
    assert main(["status", "--url", router.url]) == 0
    assert "draining" in capsys.readouterr().out


def test_commands_explain_refusals(fakes, start_router, key_file, tmp_path, capsys):
    router = start_router([fakes[0].spec], api_key="tenant-key", admin_key="admin-key")
    args = ["--url", router.url, "--admin-key-file", str(key_file)]
    assert main(["drain", "nope", *args]) == 1
    assert "404" in capsys.readouterr().err
    assert main(["scale", "2", *args]) == 1  # a standalone router runs no replica processes
    assert "only `kvmesh serve` does" in capsys.readouterr().err
    wrong = write_admin_key(tmp_path / "other", "not-the-admin-key")
    assert main(["rollout", "--url", router.url, "--admin-key-file", str(wrong)]) == 1
    assert "403" in capsys.readouterr().err
    assert main(["scale", "2", "--url", router.url, "--admin-key-file", str(tmp_path / "missing")]) == 2
    assert "no admin key at" in capsys.readouterr().err
    assert main(["rollout", "--engine", "oops", *args]) == 2
    assert "FIELD=VALUE" in capsys.readouterr().err


def test_rollout_settings_parse_as_json_else_text():
    assert parse_settings(["max_num_seqs=64", "attention_backend=torch", "enable_prefix_caching=false"]) == {
        "max_num_seqs": 64, "attention_backend": "torch", "enable_prefix_caching": False}
