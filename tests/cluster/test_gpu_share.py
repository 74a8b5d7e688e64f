"""replicas.gpus_per_replica: several replicas on one GPU, each with its share of the card's memory;
tensor parallelism keeps whole GPUs; settings that cannot work are refused with what to set."""

from __future__ import annotations

import pytest
from kvmesh.cluster.config.loader import ConfigError, load_config
from kvmesh.cluster.config.trees import ReplicasConfig, ServeConfig
from kvmesh.cluster.launch.launcher import ServeCluster
from kvmesh.cluster.launch.placement import replica_bundles
from kvmesh.replica.config import EngineConfig


def _config(gpus_per_replica=None, tp=1, **engine) -> ServeConfig:
    return ServeConfig(engine=EngineConfig(model="embedded", tensor_parallel_size=tp, **engine),
                       replicas=ReplicasConfig(gpus_per_replica=gpus_per_replica))


def _engine_on(device: str, config: ServeConfig) -> EngineConfig:
    cluster = ServeCluster(config, report=lambda _: None)
    cluster.state.device, cluster.state.model_path = device, "/models/m"
    return cluster.engine_config()


def test_a_half_gpu_replica_asks_ray_for_half_a_gpu():
    config = _config(0.5)
    assert config.gpus_per_worker == 0.5
    assert replica_bundles(1, 1.0, "cuda", config.gpus_per_worker) == [{"CPU": 1.0, "GPU": 0.5}]


def test_by_default_each_tp_worker_holds_one_whole_gpu():
    config = _config(tp=2)
    assert config.gpus_per_worker == 1.0
    assert replica_bundles(2, 1.0, "cuda", config.gpus_per_worker)[:2] == [{"CPU": 1.0, "GPU": 1.0}] * 2


def test_default_memory_utilization_becomes_the_replicas_share_of_the_card():
    assert _engine_on("cuda", _config(0.5)).gpu_memory_utilization == pytest.approx(0.45)
    assert _engine_on("cuda", _config(0.25)).gpu_memory_utilization == pytest.approx(0.225)
    assert _engine_on("cuda", _config()).gpu_memory_utilization == 0.9  # a whole GPU: unchanged


def test_an_explicit_memory_utilization_is_each_replicas_own():
    assert _engine_on("cuda", _config(0.5, gpu_memory_utilization=0.4)).gpu_memory_utilization == 0.4
    assert _engine_on("cuda", _config(0.33, gpu_memory_utilization=0.3)).gpu_memory_utilization == 0.3


def test_explicit_utilizations_that_overfill_a_card_are_refused():
    with pytest.raises(ValueError, match=r"puts 2 replicas on one GPU.*adds up to 1.20.*at most 0.5 each"):
        _config(0.5, gpu_memory_utilization=0.6)
    with pytest.raises(ValueError, match=r"puts 3 replicas on one GPU.*at most 0.33 each"):
        _config(0.33, gpu_memory_utilization=0.34)


def test_tensor_parallelism_needs_whole_gpus():
    with pytest.raises(ValueError, match="tensor parallelism needs a whole GPU per worker"):
        _config(0.5, tp=2)
    assert _config(2, tp=2).gpus_per_worker == 1.0


def test_more_than_one_gpu_without_tensor_parallelism_is_refused():
    with pytest.raises(ValueError, match="runs on one GPU; use at most 1.*tensor_parallel_size 2"):
        _config(2)


@pytest.mark.parametrize("value, why", [(0, "must be > 0"), (-0.5, "must be > 0"),
                                        (0.33333, "steps of 0.0001")])
def test_gpu_shares_ray_cannot_express_are_refused(value, why):
    with pytest.raises(ValueError, match=why):
        _config(value)


def test_the_cli_names_the_setting_and_does_not_trace_back():
    with pytest.raises(ConfigError, match=r"^config: replicas.gpus_per_replica=0.5 with engine.tensor_parallel_size=2"):
        load_config(overrides={"replicas.gpus_per_replica": 0.5, "engine.tensor_parallel_size": 2}, env={})


def test_cpu_replicas_ignore_the_gpu_share():
    assert replica_bundles(1, 1.0, "cpu", 0.5) == [{"CPU": 1.0}]
    assert _engine_on("cpu", _config(0.5)).gpu_memory_utilization == 0.9


def test_a_rollout_cannot_overfill_a_shared_card():
    from types import SimpleNamespace

    from kvmesh.cluster.fleet.operations import Fleet
    from prometheus_client import CollectorRegistry

    cluster = ServeCluster(_config(0.5), report=lambda _: None)
    cluster.state.device, cluster.state.model_path = "cuda", "/models/m"
    cluster.state.engine = cluster.engine_config()  # 0.45 each, as running
    metrics = SimpleNamespace(registry=CollectorRegistry())
    cluster.state.router = SimpleNamespace(runtime=SimpleNamespace(metrics=metrics))
    fleet = Fleet(cluster)  # not started: requests are only checked and queued
    with pytest.raises(ValueError, match=r"bad engine settings.*puts 2 replicas on one GPU.*adds up to 1.20"):
        fleet.request_rollout({"gpu_memory_utilization": 0.6})
    assert fleet.request_rollout({"gpu_memory_utilization": 0.4})["accepted"]
