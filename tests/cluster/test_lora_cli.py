"""`kvmesh lora load/unload` against a small fake of the router's admin endpoints (vLLM's adapter API)."""

from __future__ import annotations

import pytest
from kvmesh.cluster.admin_key import write_private
from kvmesh.cluster.cli import main

from .fake_json_server import JSONHandler, serving


class _FakeRouter(JSONHandler):
    calls: list[tuple[str, dict, str | None]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.read_json()
        self.calls.append((self.path, body, self.headers.get("Authorization")))
        if self.headers.get("Authorization") != "Bearer admin-key":
            return self.answer(403, {"error": {"message": "admin key required", "type": "forbidden"}})
        if body.get("base_model_name") == "nope":
            return self.answer(404, {"error": {"message": "The model `nope` does not exist", "type": "NotFound"}})
        if self.path == "/v1/load_lora_adapter":
            return self.answer(200, {"lora_name": body["lora_name"], "lora_path": body["lora_path"],
                                      "base_model_name": body.get("base_model_name", "base"),
                                      "loaded_on": ["r0", "r1"], "failed": {"r2": "no such directory"}})
        return self.answer(200, {"lora_name": body["lora_name"], "unloaded_from": ["r0"], "failed": {}})


@pytest.fixture
def router_url():
    _FakeRouter.calls = []
    with serving(_FakeRouter) as url:
        yield url


def test_lora_load_and_unload_call_the_routers_admin_endpoints(router_url, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("KVMESH_ADMIN_KEY", raising=False)
    key = write_private(tmp_path / "admin_key", "admin-key")
    args = ["--url", router_url, "--admin-key-file", str(key)]
    assert main(["lora", "load", "sql", "/adapters/sql", "--deployment", "llama", *args]) == 0
    out = capsys.readouterr().out
    assert "sql loaded on 2 replica(s) of llama: r0, r1; r2 failed: no such directory" in out
    assert _FakeRouter.calls[-1] == ("/v1/load_lora_adapter",
                                     {"lora_name": "sql", "lora_path": "/adapters/sql", "base_model_name": "llama"},
                                     "Bearer admin-key")
    assert main(["lora", "load", "sql", "/adapters/sql", *args]) == 0  # one base model: none named
    assert "base_model_name" not in _FakeRouter.calls[-1][1]
    assert main(["lora", "unload", "sql", *args]) == 0
    assert "sql unloaded from 1 replica(s): r0" in capsys.readouterr().out
    assert _FakeRouter.calls[-1][:2] == ("/v1/unload_lora_adapter", {"lora_name": "sql"})


def test_lora_load_reports_the_routers_refusal(router_url, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("KVMESH_ADMIN_KEY", raising=False)
    key = write_private(tmp_path / "admin_key", "admin-key")
    assert main(["lora", "load", "sql", "/a", "--deployment", "nope", "--url", router_url,
                 "--admin-key-file", str(key)]) == 1
    assert "router answered 404: The model `nope` does not exist" in capsys.readouterr().err
    wrong = write_private(tmp_path / "other", "not-it")
    assert main(["lora", "unload", "sql", "--url", router_url, "--admin-key-file", str(wrong)]) == 1
    assert "403" in capsys.readouterr().err
