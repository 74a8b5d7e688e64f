"""`kvmesh scale/drain/rollout/status --deployment` against a small fake of the router's admin plane."""

from __future__ import annotations

import pytest
from kvmesh.cluster.admin_key import write_private
from kvmesh.cluster.cli import main
from kvmesh.cluster.commands.status import of_deployment
from kvmesh.cluster.replica_status import ReplicaStatus

from .fake_json_server import JSONHandler, serving

FLEET = {"replicas": ["replica-0", "replica-1"], "roles": {}, "target": 2, "prefill_target": 0, "busy": None,
         "queued": 0, "decisions": [], "operations": [],
         "deployments": {"replica-0": "llama", "replica-1": "tiny"}}


class _FakeAdmin(JSONHandler):
    posts: list[tuple[str, dict]] = []

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.answer(200, FLEET)

    def do_POST(self) -> None:  # noqa: N802
        body = self.read_json()
        self.posts.append((self.path, body))
        if self.path == "/admin/scale":
            return self.answer(200, {"accepted": True, "operation": f"scale {body.get('deployment')}",
                                      "replicas": ["replica-1"], "role": "both", "deployment": body.get("deployment")})
        if self.path == "/admin/rollout":
            return self.answer(200, {"accepted": True, "replicas": ["replica-0"], "engine_changes": []})
        return self.answer(200, {"id": self.path.split("/")[2], "draining": True, "in_flight": 0,
                                  "will_be_removed": True, "target": 1})


@pytest.fixture
def admin_args(tmp_path, monkeypatch):
    monkeypatch.delenv("KVMESH_ADMIN_KEY", raising=False)
    _FakeAdmin.posts = []
    key = write_private(tmp_path / "admin_key", "admin-key")
    with serving(_FakeAdmin) as url:
        yield ["--url", url, "--admin-key-file", str(key), "--wait", "0"]


def test_scale_and_rollout_send_the_deployment_and_drain_checks_it(admin_args, capsys):
    assert main(["scale", "3", "--deployment", "tiny", *admin_args]) == 0
    assert _FakeAdmin.posts[-1] == ("/admin/scale", {"replicas": 3, "deployment": "tiny"})
    assert "scaling to 3 replica(s) of tiny" in capsys.readouterr().out
    assert main(["rollout", "--deployment", "llama", "--engine", "max_num_seqs=8", *admin_args]) == 0
    assert _FakeAdmin.posts[-1] == ("/admin/rollout", {"engine": {"max_num_seqs": 8}, "deployment": "llama"})
    assert main(["drain", "replica-0", "--deployment", "tiny", *admin_args]) == 2  # replica-0 serves llama
    assert "replica-0 is not a replica of deployment 'tiny' (it serves llama)" in capsys.readouterr().err
    assert not any(path.endswith("/drain") for path, _ in _FakeAdmin.posts)
    assert main(["drain", "replica-0", "--deployment", "llama", *admin_args]) == 0
    assert _FakeAdmin.posts[-1][0] == "/replicas/replica-0/drain"


def test_status_shows_one_deployments_replicas():
    rows = [ReplicaStatus(replica_id="replica-0"), ReplicaStatus(replica_id="replica-1")]
    assert [r.replica_id for r in of_deployment(rows, FLEET, "tiny")] == ["replica-1"]
    with pytest.raises(ValueError, match="no deployment 'nope'; this cluster runs llama, tiny"):
        of_deployment(rows, FLEET, "nope")
    with pytest.raises(ValueError, match="this cluster runs no deployments"):
        of_deployment(rows, {"replicas": []}, "tiny")
