"""`kvmesh drain/scale/rollout` against a standalone router: the admin key from the file, clear errors."""

from __future__ import annotations

import pytest
from kvmesh.cluster.admin_key import publish, write_private
from kvmesh.cluster.cli import main
from kvmesh.cluster.commands.rollout import parse_settings

from .conftest import wait_for


@pytest.fixture
def key_file(tmp_path, monkeypatch):
    monkeypatch.delenv("KVMESH_ADMIN_KEY", raising=False)
    monkeypatch.setenv("KVMESH_API_KEY", "tenant-key")
    return write_private(tmp_path / "admin_key", "admin-key")


def test_drain_command_takes_the_replica_out_of_rotation(fakes, start_router, key_file, capsys):
    router = start_router([fakes[0].spec, fakes[1].spec], api_key="tenant-key", admin_key="admin-key")
    wait_for(lambda: len(router.runtime.router.healthy) == 2, what="both replicas healthy")
    assert main(["drain", "b", "--url", router.url, "--admin-key-file", str(key_file)]) == 0
    assert "b is draining: no new requests; 0 request(s) in flight finish first. It stays registered" in (
        capsys.readouterr().out)
    assert router.runtime.draining == {"b"} and router.runtime.router.healthy == {"a"}
    assert main(["status", "--url", router.url, "--admin-key-file", str(key_file)]) == 0
    assert "draining" in capsys.readouterr().out


def test_commands_explain_refusals(fakes, start_router, key_file, tmp_path, capsys):
    router = start_router([fakes[0].spec], api_key="tenant-key", admin_key="admin-key")
    args = ["--url", router.url, "--admin-key-file", str(key_file)]
    assert main(["drain", "nope", *args]) == 1
    assert "404" in capsys.readouterr().err
    assert main(["scale", "2", *args]) == 1  # a standalone router runs no replica processes
    assert "only `kvmesh serve` does" in capsys.readouterr().err
    wrong = write_private(tmp_path / "other", "not-the-admin-key")
    assert main(["rollout", "--url", router.url, "--admin-key-file", str(wrong)]) == 1
    assert "403" in capsys.readouterr().err
    assert main(["scale", "2", "--url", router.url, "--admin-key-file", str(tmp_path / "missing")]) == 2
    assert "no admin key at" in capsys.readouterr().err
    assert main(["rollout", "--engine", "oops", *args]) == 2
    assert "FIELD=VALUE" in capsys.readouterr().err


def test_rollout_settings_parse_as_json_else_text():
    assert parse_settings(["max_num_seqs=64", "attention_backend=torch", "enable_prefix_caching=false"]) == {
        "max_num_seqs": 64, "attention_backend": "torch", "enable_prefix_caching": False}


def test_two_clusters_on_one_machine_keep_separate_working_admin_keys(fakes, start_router, tmp_path, monkeypatch,
                                                                       capsys):
    monkeypatch.delenv("KVMESH_ADMIN_KEY", raising=False)
    monkeypatch.setenv("KVMESH_CLUSTERS_DIR", str(tmp_path / "clusters"))
    first = start_router([fakes[0].spec], admin_key="first-admin-key")
    second = start_router([fakes[1].spec], admin_key="second-admin-key")
    publish(first.url, "first-admin-key")  # what each `kvmesh serve` does once its router listens
    wait_for(lambda: len(first.runtime.router.healthy) == 1, what="the first cluster's replica healthy")
    assert main(["drain", "a"]) == 0  # one cluster running: no flag needed
    assert first.runtime.draining == {"a"}
    publish(second.url, "second-admin-key")  # a second cluster starts: the first's key stays
    assert main(["drain", "b"]) == 2
    err = capsys.readouterr().err
    assert "2 kvmesh clusters run here" in err and first.url in err and second.url in err and "--url" in err
    assert main(["drain", "b", "--url", second.url]) == 0 and second.runtime.draining == {"b"}
    assert main(["drain", "a", "--url", first.url]) == 0  # the first cluster's key still works
    assert "router answered 403" not in capsys.readouterr().err


def test_status_finds_the_one_cluster_and_asks_for_url_among_several(fakes, start_router, tmp_path, monkeypatch,
                                                                     capsys):
    monkeypatch.delenv("KVMESH_ADMIN_KEY", raising=False)
    monkeypatch.setenv("KVMESH_CLUSTERS_DIR", str(tmp_path / "clusters"))
    monkeypatch.setenv("KVMESH_API_KEY", "tenant-key")
    first = start_router([fakes[0].spec], api_key="tenant-key", admin_key="first-admin-key")
    publish(first.url, "first-admin-key")
    assert main(["status"]) == 0 and f"router {first.url}" in capsys.readouterr().out
    publish("http://127.0.0.1:1", "another-admin-key")
    assert main(["status"]) == 2 and "pick one with --url" in capsys.readouterr().err


def test_drain_inside_serve_says_the_target_drops_and_how_to_restore_it():
    from kvmesh.cluster.commands.drain import describe

    text = describe({"id": "replica-1", "in_flight": 2, "will_be_removed": True, "target": 2})
    assert "2 request(s) in flight finish first" in text
    assert "target becomes 2 replica(s)" in text and "`kvmesh scale 3`" in text


def test_status_of_an_api_key_cluster_finds_the_key_in_its_record(fakes, start_router, tmp_path, monkeypatch,
                                                                  capsys):
    monkeypatch.delenv("KVMESH_ADMIN_KEY", raising=False)
    monkeypatch.delenv("KVMESH_API_KEY", raising=False)
    monkeypatch.setenv("KVMESH_CLUSTERS_DIR", str(tmp_path / "clusters"))
    router = start_router([fakes[0].spec], api_key="tenant-key", admin_key="admin-key")
    publish(router.url, "admin-key", api_key="tenant-key")  # what `kvmesh serve --api-key` does
    assert main(["status"]) == 0, capsys.readouterr().err
    assert f"router {router.url}: " in capsys.readouterr().out
    wrong = write_private(tmp_path / "wrong_key", "wrong-admin-key")
    assert main(["status", "--url", router.url, "--admin-key-file", str(wrong)]) == 1  # a given key wins
    err = capsys.readouterr().err
    assert "answered 403" in err and "admin key" in err  # the replica list (URLs) is the admin plane's


def test_localhost_names_the_cluster_at_127_0_0_1(fakes, start_router, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("KVMESH_ADMIN_KEY", raising=False)
    monkeypatch.delenv("KVMESH_API_KEY", raising=False)
    monkeypatch.setenv("KVMESH_CLUSTERS_DIR", str(tmp_path / "clusters"))
    router = start_router([fakes[0].spec, fakes[1].spec], api_key="tenant-key", admin_key="admin-key")
    publish(router.url, "admin-key", api_key="tenant-key")
    wait_for(lambda: len(router.runtime.router.healthy) == 2, what="both replicas healthy")
    localhost = router.url.replace("127.0.0.1", "localhost") + "/"
    assert main(["status", "--url", localhost]) == 0, capsys.readouterr().err
    assert main(["drain", "b", "--url", localhost, "--wait", "0"]) == 0, capsys.readouterr().err
    assert router.runtime.draining == {"b"}
