"""What ``kvmesh serve`` hands each replica: its config sections whole, composed from the serve config.

    ServeConfig ──▶ engine   EngineConfig          the model path and device serve resolved, the cluster's
                                                   hash seed, a GPU share's memory, the embedded model's sizes
                ──▶ server   ReplicaServerConfig   replica i's ports (replicas.http_port + i, event_port + 2i),
                                                   the cluster's internal key (the router's; the only
                                                   key it takes: router_only), the served name
                ──▶ events   PublisherConfig       the events section, plus the CURVE keys of private streams
                ──▶ frontend FrontendConfig        as configured
                ──▶ kv_transfer KVTransferConfig   serve's section, on as replicas.kv_transfer says
                                                   (cluster/config/roles.py), transport nixl (``local`` moves KV
                                                   only inside one process)

The replica actor then starts ``ReplicaRuntime`` with them.
"""

from __future__ import annotations

from dataclasses import replace

from kvmesh.cluster.config.gpu_share import replica_memory_utilization
from kvmesh.cluster.config.roles import kv_transfer_on
from kvmesh.cluster.config.trees import ServeConfig
from kvmesh.cluster.launch.event_keys import CurveKeys
from kvmesh.cluster.launch.ray_cluster import LOCAL_HOST
from kvmesh.events.config import PublisherConfig
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.kv_transfer.config import KVTransferConfig
from kvmesh.replica.server.config import AUTO_HOST, ReplicaServerConfig

# KV cache per replica on CPU when the config sets none and the model is the embedded one:
# 2 KiB/token x 32k tokens -- plenty for a demo, small enough for a laptop.
EMBEDDED_KV_CACHE_MEMORY = 64 << 20


def replica_engine(cfg: ServeConfig, model_path: str, device: str, hash_seed: str) -> EngineConfig:
    """The engine section as every replica gets it (with the cluster's secret hash seed)."""
    engine = cfg.engine
    if device == "cuda":  # a fraction of a GPU: that share of its memory (cluster/config/gpu_share.py)
        engine = replace(engine, gpu_memory_utilization=replica_memory_utilization(
            cfg.replicas.gpus_per_replica, engine.gpu_memory_utilization))
    return replace(
        engine, model=model_path, device=device,
        load_format="dummy" if cfg.is_embedded_model else engine.load_format,
        kv_cache_memory=EMBEDDED_KV_CACHE_MEMORY if engine.kv_cache_memory is None and cfg.is_embedded_model
        else engine.kv_cache_memory,
        hash_seed=hash_seed)


def replica_events(cfg: ServeConfig, curve: CurveKeys | None) -> PublisherConfig:
    """The events section as every replica gets it (its addresses come from its server section)."""
    return curve.publisher(cfg.events) if curve is not None else cfg.events


def replica_server(cfg: ServeConfig, index: int, served_model_name: str, local: bool,
                   internal_key: str | None) -> ReplicaServerConfig:
    """Replica ``index``'s server section: its ports, the cluster's internal key (the router's, the only key it takes:
    ``router_only``, so tenants reach it only through the router's admission; the tenants' API key is handed over
    only so a tenant calling it directly is told why it gets 403), the served name (and the router's other names for
it: requests go on with the name the client gave).

    On a local Ray instance it listens on loopback; otherwise the actor takes its node's address."""
    rc = cfg.replicas
    http_port, (event_port, replay_port) = rc.http_ports(index + 1)[index], rc.event_ports(index + 1)[index]
    return ReplicaServerConfig(host=LOCAL_HOST if local else AUTO_HOST, port=http_port, event_port=event_port,
                               replay_port=replay_port, api_key=cfg.router.api_key, internal_key=internal_key,
                               router_only=internal_key is not None, served_model_name=served_model_name,
                               served_model_aliases=cfg.router.served_names()[1:]
                               if served_model_name == cfg.router.served_name else ())


def replica_kv_transfer(cfg: ServeConfig) -> KVTransferConfig:
    """The kv_transfer section every replica gets: serve's, enabled as ``replicas.kv_transfer`` says (auto: with
    prefill replicas), transport nixl. The only place serve builds it."""
    rc = cfg.replicas
    enabled = kv_transfer_on(rc.kv_transfer, rc.num_prefill_replicas)
    return replace(cfg.kv_transfer, enabled=enabled, transport="nixl")
