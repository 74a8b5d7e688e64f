"""A flag that changes nothing on the device the replicas turn out to use (``--gpu-memory-utilization`` on CPU) is
said once at start-up, not taken without a word; given nowhere, or on a GPU, nothing is said."""

from __future__ import annotations

import pytest
from kvmesh.cluster.cli import build_parser
from kvmesh.cluster.config.flags import config_from_args
from kvmesh.cluster.config.trees import SERVE_SCHEMA

NOTE = ("--gpu-memory-utilization has no effect: the replicas run on CPU, where the KV cache is sized by "
        "--kv-cache-memory (1 GiB per replica unless set)")


class Stop(Exception):
    """Ends ServeCluster.start right after the device is known."""


def start_on(device: str, argv: list[str], monkeypatch) -> list[str]:
    from kvmesh.cluster.commands.serve import cpu_notes as serve_cpu_notes
    from kvmesh.cluster.launch import launcher, preflight, ray_cluster

    args = build_parser().parse_args(["serve", *argv])
    reports: list[str] = []
    cluster = launcher.ServeCluster(config_from_args(args, SERVE_SCHEMA, env={}), report=reports.append)
    cluster.cpu_notes = tuple(serve_cpu_notes(args))
    monkeypatch.setattr(preflight, "check", lambda config: None)
    monkeypatch.setattr(preflight, "check_port_free", lambda *a: None)
    monkeypatch.setattr(ray_cluster, "connect", lambda config, log_to_driver: None)
    monkeypatch.setattr(ray_cluster, "router_host", lambda config, handle: "127.0.0.1")
    monkeypatch.setattr(ray_cluster, "resolve_device", lambda config, handle: device)

    def stop(*a):
        raise Stop

    monkeypatch.setattr(launcher, "resolve_model_path", stop)
    with pytest.raises(Stop):
        cluster.start()
    return reports


def test_serve_says_once_that_gpu_memory_utilization_means_nothing_on_cpu(monkeypatch):
    reports = start_on("cpu", ["--gpu-memory-utilization", "0.5"], monkeypatch)
    assert reports.count(NOTE) == 1


@pytest.mark.parametrize(("device", "argv"), [("cuda", ["--gpu-memory-utilization", "0.5"]), ("cpu", [])])
def test_nothing_is_said_on_a_gpu_or_when_the_flag_is_not_given(device, argv, monkeypatch):
    assert not [line for line in start_on(device, argv, monkeypatch) if "gpu-memory-utilization" in line]


def test_the_replica_command_says_it_on_cpu(monkeypatch, capsys):
    from kvmesh.cluster.commands import replica

    def refuse(config, model_runner=None, **kwargs):
        raise OSError("not started by this test")

    monkeypatch.setattr(replica, "start", refuse)
    args = build_parser().parse_args(["replica", "--model", "embedded", "--port", "0", "--event-port", "0",
                                      "--replay-port", "0", "--device", "cpu", "--gpu-memory-utilization", "0.8"])
    assert args.func(args) == 1
    assert capsys.readouterr().err.count(f"kvmesh replica: {NOTE}") == 1

