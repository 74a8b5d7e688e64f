"""``--host 0.0.0.0`` (or any address other machines reach) without an API key starts, as vLLM does, but says in
a block on stderr that anyone can call it and how to close it: ``kvmesh serve``, ``router`` and ``replica``."""

from __future__ import annotations

import pytest
from kvmesh.cluster.cli import build_parser
from kvmesh.cluster.open_bind import is_loopback

KEY = "a-long-enough-key"
WARNING = "with no API key"


@pytest.mark.parametrize(("host", "loopback"), [("127.0.0.1", True), ("127.0.0.2", True), ("::1", True),
                                                ("localhost", True), ("0.0.0.0", False), ("::", False),
                                                ("10.1.2.3", False), ("my-host.example", False)])
def test_loopback_is_only_this_machine(host, loopback):
    assert is_loopback(host) is loopback


def router_err(argv: list[str], monkeypatch, capsys) -> str:
    from kvmesh.router.control import router_server

    class NotStarted:
        def __init__(self, config, specs):
            pass

        def run(self):
            return 0

    monkeypatch.setattr(router_server, "RouterServer", NotStarted)
    monkeypatch.delenv("KVMESH_API_KEY", raising=False)
    args = build_parser().parse_args(["router", "--port", "0", "--workers", "1", *argv])
    assert args.func(args) == 0
    return capsys.readouterr().err


def test_the_router_on_every_address_without_a_key_warns_loudly(monkeypatch, capsys):
    err = router_err(["--host", "0.0.0.0"], monkeypatch, capsys)
    lines = [line for line in err.splitlines() if line.startswith("kvmesh router: ")]
    assert "kvmesh router: WARNING: the router listens on 0.0.0.0:0 with no API key: anyone on any network can " \
           "send it requests." in lines
    assert any("Set KVMESH_API_KEY (or --api-key, or --admission-keys-file), or bind --host 127.0.0.1." in line
               for line in lines)
    assert sum(line.endswith("*" * 78) for line in lines) == 2


@pytest.mark.parametrize("argv", [["--host", "127.0.0.1"], ["--host", "0.0.0.0", "--api-key", KEY], []])
def test_the_router_says_nothing_on_loopback_or_with_a_key(argv, monkeypatch, capsys):
    assert WARNING not in router_err(argv, monkeypatch, capsys)


def replica_err(argv: list[str], monkeypatch, capsys) -> str:
    from kvmesh.cluster.commands import replica

    def refuse(config, model_runner=None, **kwargs):
        raise OSError("not started by this test")

    monkeypatch.setattr(replica, "start", refuse)
    monkeypatch.delenv("KVMESH_API_KEY", raising=False)
    args = build_parser().parse_args(["replica", "--model", "embedded", "--port", "0", "--event-port", "0",
                                      "--replay-port", "0", *argv])
    assert args.func(args) == 1
    return capsys.readouterr().err


def test_the_replica_on_every_address_without_a_key_warns(monkeypatch, capsys):
    assert "kvmesh replica: WARNING: the replica listens on 0.0.0.0:0 with no API key" in \
        replica_err(["--host", "0.0.0.0"], monkeypatch, capsys)


def test_the_replica_with_a_key_says_nothing(monkeypatch, capsys):
    assert WARNING not in replica_err(["--host", "0.0.0.0", "--api-key", KEY], monkeypatch, capsys)


def serve_err(argv: list[str], monkeypatch, capsys) -> str:
    from kvmesh.cluster.commands import serve
    from kvmesh.cluster.launch import preflight

    monkeypatch.setattr(preflight, "check", lambda config: None)
    monkeypatch.delenv("KVMESH_API_KEY", raising=False)
    config = serve.prepare(build_parser().parse_args(["serve", *argv]))
    assert not isinstance(config, int)
    return capsys.readouterr().err


def test_serve_with_its_router_on_every_address_without_a_key_warns(monkeypatch, capsys):
    err = serve_err(["--host", "0.0.0.0"], monkeypatch, capsys)
    assert "kvmesh serve: WARNING: the router listens on 0.0.0.0:8000 with no API key" in err


@pytest.mark.parametrize("argv", [[], ["--host", "0.0.0.0", "--api-key", KEY]])
def test_serve_on_loopback_or_with_a_key_says_nothing(argv, monkeypatch, capsys):
    assert WARNING not in serve_err(argv, monkeypatch, capsys)


def test_serve_with_a_keys_file_says_nothing(tmp_path, monkeypatch, capsys):
    keys = tmp_path / "keys.yaml"
    keys.write_text("tenants:\n  ann:\n    keys: [" + KEY + "]\n")
    err = serve_err(["--host", "0.0.0.0", "--admission-keys-file", str(keys)], monkeypatch, capsys)
    assert WARNING not in err
