"""The cluster's block-hash seed: generated at start unless configured, shared, never shown."""

from __future__ import annotations

from kvmesh.cluster.config.loader import from_dict, load_config
from kvmesh.cluster.launch.launcher import ServeCluster


def _engine_config(config):
    cluster = ServeCluster(config, report=lambda _: None)
    cluster.state.model_path, cluster.state.device = "/models/x", "cpu"
    return cluster.engine_config()


def test_seed_is_generated_per_cluster_when_not_configured():
    first, second = _engine_config(from_dict({})), _engine_config(from_dict({}))
    assert isinstance(first.hash_seed, str) and len(first.hash_seed) == 64  # 32 random bytes, hex
    assert first.hash_seed != second.hash_seed


def test_configured_seed_reaches_the_engine_and_not_its_repr():
    seed = "0123456789abcdef-secret"
    engine = _engine_config(load_config(env={"KVMESH_HASH_SEED": seed}))
    assert engine.hash_seed == seed
    assert seed not in repr(engine) and "secret" not in repr(engine)


def test_embedded_model_uses_dummy_weights_and_a_small_cache():
    engine = _engine_config(from_dict({}))
    assert engine.load_format == "dummy" and engine.kv_cache_memory == 64 << 20
