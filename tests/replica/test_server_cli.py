"""``kvmesh replica`` parses its flags into the same engine: and events: sections as ``kvmesh serve``."""

from __future__ import annotations

import pytest
from kvmesh.cluster.cli import build_parser, main
from kvmesh.cluster.commands.replica import load

MODEL = "some/model"  # parsing only: load() (which checks the model) is not called


def parse(*argv: str):
    return build_parser().parse_args(["replica", "--model", MODEL, "--load-format", "dummy", *argv])


def _load(*argv: str, env: dict | None = None):
    from kvmesh.cluster.config.flags import config_from_args
    from kvmesh.cluster.config.trees import REPLICA_SCHEMA

    return config_from_args(parse(*argv), REPLICA_SCHEMA, env=env or {})


def test_defaults_follow_design_ports_and_loopback():
    server = _load().server
    assert (server.host, server.port, server.event_port, server.replay_port) == ("127.0.0.1", 8100, 5557, 5558)
    assert server.api_key is None


def test_the_embedded_model_is_served_as_kvmesh_serve_serves_it(tmp_path, monkeypatch):
    from kvmesh.cluster.launch.replica_sections import EMBEDDED_KV_CACHE_MEMORY

    monkeypatch.setenv("KVMESH_CACHE_DIR", str(tmp_path))
    config = load(build_parser().parse_args(["replica", "--model", "embedded", "--port", "0", "--event-port", "0",
                                             "--replay-port", "0"]))
    engine = config.engine
    assert engine.load_format == "dummy" and engine.model.startswith(str(tmp_path))
    assert engine.kv_cache_memory == EMBEDDED_KV_CACHE_MEMORY
    assert config.server.served_model_name == "kvmesh-embedded"
    named = load(build_parser().parse_args(["replica", "--model", "embedded", "--served-model-name", "tiny",
                                            "--port", "0", "--event-port", "0", "--replay-port", "0"]))
    assert named.server.served_model_name == "tiny"


def test_flags_reach_the_engine_config(stories_path):
    model = str(stories_path)
    args = build_parser().parse_args([
        "replica", "--model", model, "--tensor-parallel-size", "2", "--block-size", "32", "--max-model-len", "256",
        "--no-enable-prefix-caching", "--events-endpoint", "connect://tcp://collector:5557", "--replay-port", "0",
        "--port", "0", "--topic", "kv"])
    config = load(args)
    engine, events = config.engine, config.server.publisher_config(config.events)
    assert engine.tensor_parallel_size == 2 and engine.block_size == 32 and engine.max_model_len == 256
    assert engine.enable_prefix_caching is False and events.topic == "kv"
    assert events.endpoint == "connect://tcp://collector:5557"
    assert events.replay_endpoint == "tcp://127.0.0.1:0"


def test_api_key_comes_from_the_environment():
    assert _load(env={"KVMESH_API_KEY": "from-env-secret"}).server.api_key == "from-env-secret"


@pytest.mark.parametrize(("argv", "message"), [
    (["replica", "--model", "/bad/path"], "is not a directory"),
    (["replica"], "engine.model (--model or KVMESH_ENGINE_MODEL): is required"),
    (["replica", "--model", "/tmp", "--api-key", "short"], "at least 8"),
])
def test_a_users_mistake_is_one_line_not_a_traceback(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_router_and_a_replica_given_the_same_relative_model_agree_on_its_name(stories_path, monkeypatch,
                                                                                 tmp_path):
    """`kvmesh replica --model M` and `kvmesh router --model M` with a relative M: the name the router
    advertises is one the replica serves (vLLM's rule: the --model as given; its absolute and resolved paths
    aliases). Both run in a directory reached through a symbolic link (as ../shared is on some machines): the
    path through the link, the resolved one and the relative one all name the model."""
    import httpx
    from kvmesh.cluster.commands.replica import start
    from kvmesh.cluster.config.flags import config_from_args
    from kvmesh.cluster.config.trees import ROUTER_SCHEMA
    from kvmesh.router.config import ReplicaSpec
    from kvmesh.router.control.router_server import RouterServer

    link = tmp_path / "models-link"
    link.symlink_to(stories_path.parent.parent.resolve())
    monkeypatch.chdir(link)
    model = f"{stories_path.parent.name}/{stories_path.name}"  # e.g. stories260K/hf
    replica = start(load(build_parser().parse_args(["replica", "--model", model, "--port", "0", "--event-port",
                                                    "0", "--replay-port", "0", "--kv-cache-memory", "4MiB"])))
    try:
        endpoints = replica.endpoints()
        spec = ReplicaSpec(endpoints["http_url"], endpoints["events_endpoint"], endpoints["replay_endpoint"])
        command = config_from_args(build_parser().parse_args(["router", "--model", model, "--port", "0"]),
                                   ROUTER_SCHEMA, env={})
        router = RouterServer(command.router, [spec]).start()
        try:
            (advertised,) = [m["id"] for m in httpx.get(router.url + "/v1/models", timeout=10).json()["data"]]
            assert advertised == model
            for name in (advertised, str(stories_path), str(stories_path.resolve()), str(link / model)):
                body = {"model": name, "prompt": "Once upon a time", "max_tokens": 2}
                r = httpx.post(router.url + "/v1/completions", json=body, timeout=60)
                assert r.status_code == 200, r.text
        finally:
            router.stop()
    finally:
        replica.shutdown(graceful_s=1)


def test_kv_transfer_flags_reach_the_kv_transfer_section():
    config = _load("--kv-transfer", "--kv-transfer-transport", "local", "--kv-transfer-lease-ttl-s", "5")
    assert config.kv_transfer.enabled and config.kv_transfer.transport == "local"
    assert config.kv_transfer.lease_ttl_s == 5.0
    assert _load().kv_transfer.enabled is False  # a bare replica moves no KV


def test_kv_peer_is_repeatable_and_the_variable_comma_separated():
    config = _load("--kv-peer", "http://10.0.0.1:8100", "--kv-peer", "http://10.0.0.2:8100")
    assert config.kv_transfer.peers == ("http://10.0.0.1:8100", "http://10.0.0.2:8100")
    env = {"KVMESH_KV_TRANSFER_PEERS": "http://a:1, http://b:2"}
    assert _load(env=env).kv_transfer.peers == ("http://a:1", "http://b:2")
    with pytest.raises(Exception, match="'gopher://x' is not an http"):
        _load("--kv-peer", "gopher://x")


def test_lease_caps_are_flags_and_a_default_ttl_above_the_cap_is_refused():
    config = _load("--kv-transfer-max-lease-ttl-s", "20", "--kv-transfer-max-leases-per-peer", "8",
                   "--kv-transfer-max-leases", "16", "--kv-transfer-max-leased-blocks-fraction", "0.25",
                   "--kv-transfer-lease-ttl-s", "10")
    kv = config.kv_transfer
    assert (kv.max_lease_ttl_s, kv.max_leases_per_peer, kv.max_leases, kv.max_leased_blocks_fraction) == (
        20.0, 8, 16, 0.25)
    with pytest.raises(Exception, match="lease_ttl_s .90.0. is above max_lease_ttl_s .60.0."):
        _load("--kv-transfer-lease-ttl-s", "90")


def test_kv_transfer_with_tensor_parallelism_needs_a_transport_across_processes():
    from kvmesh.replica.config import EngineConfig
    from kvmesh.replica.kv_transfer.config import KVTransferConfig
    from kvmesh.replica.runtime import check_kv_transfer

    tp2 = EngineConfig(model=MODEL, tensor_parallel_size=2)
    with pytest.raises(ValueError, match="'local' copies inside one process.*--kv-transfer-transport nixl"):
        check_kv_transfer(KVTransferConfig(enabled=True, transport="local"), tp2)
    check_kv_transfer(KVTransferConfig(enabled=True, transport="nixl"), tp2)  # a pull per rank
    check_kv_transfer(KVTransferConfig(enabled=False, transport="local"), tp2)


def test_kv_transfer_on_a_reachable_host_without_an_internal_key_refuses_to_start(capsys):
    """Anyone reaching such a replica could lease, read and plant KV: it names the flag and the variable."""
    assert main(["replica", "--model", "/tmp", "--kv-transfer", "--host", "10.1.2.3"]) == 2
    err = capsys.readouterr().err
    assert "--internal-key" in err and "KVMESH_INTERNAL_KEY" in err and "Traceback" not in err


def test_kv_transfer_with_an_internal_key_or_on_loopback_is_accepted():
    on_host = _load("--kv-transfer", "--host", "10.1.2.3", env={"KVMESH_INTERNAL_KEY": "cluster-internal-key"})
    assert on_host.server.internal_key == "cluster-internal-key" and on_host.kv_transfer.enabled
    assert _load("--kv-transfer").server.internal_key is None  # 127.0.0.1: only this host reaches it
    assert _load("--internal-key", "cluster-internal-key").server.internal_key == "cluster-internal-key"


def test_the_internal_key_must_not_be_the_tenants_key(capsys):
    assert main(["replica", "--model", "/tmp", "--api-key", "same-secret-1", "--internal-key", "same-secret-1"]) == 2
    assert "internal_key equals server.api_key" in capsys.readouterr().err
