"""Checks that run before Ray starts or a model loads, so a user's mistake costs a second, not minutes.

``check(ServeConfig)``: the model resolves (local directory with config.json, or a Hugging Face
id in the cache / on the hub, one request, no retries; a cached id with no hub in reach sets
HF_HUB_OFFLINE=1 for the replicas) and every fixed port this machine will bind is free: the
router's, and on an embedded Ray instance the replicas' HTTP and event ports; and an embedded Ray's
one node (this machine's GPUs as Ray detects them, ``ray.num_cpus``) holds the replicas.
"""

from __future__ import annotations

import logging
import os
import socket

from kvmesh.cluster.config.gpu_share import check_device_share
from kvmesh.cluster.config.trees import ServeConfig
from kvmesh.cluster.launch.model_files import check_model, hub_reachable

logger = logging.getLogger(__name__)


class PreflightError(ValueError):
    """The config cannot start here; the message says what to change."""


def check(config: ServeConfig) -> None:
    if config.deployments.models:  # several models: each one's files, every port (deployment_launch.py)
        from kvmesh.cluster.launch.deployment_launch import preflight_deployments

        try:
            return preflight_deployments(config, check_port_free)
        except PreflightError:
            raise
        except ValueError as e:
            raise PreflightError(str(e)) from None
    if not config.is_embedded_model:
        try:
            path = check_model(config.engine.model)
        except ValueError as e:
            raise PreflightError(str(e)) from None
        if not os.path.isdir(path) and not hub_reachable():
            # A hub id found in the local cache, and no hub: the replicas (which inherit this
            # environment) load from the cache instead of retrying the network for minutes.
            os.environ["HF_HUB_OFFLINE"] = "1"
    ports = []
    if config.router.host != "auto" or config.is_embedded_ray:  # "auto" in a Ray cluster: the node's IP, later
        host = "127.0.0.1" if config.router.host == "auto" else config.router.host
        ports.append(("router.port", host, config.router.port))
    if config.is_embedded_ray:  # the replicas bind on this machine too
        host = "127.0.0.1"
        started = config.replicas.num_started
        ports += [("replicas.http_port", host, p) for p in config.replicas.http_ports(started)]
        ports += [("replicas.event_port", host, p) for pair in config.replicas.event_ports(started) for p in pair]
    for what, host, port in ports:
        check_port_free(host, port, what)
    check_kv_transfer(config)
    if config.is_embedded_ray:
        check_embedded_capacity(config)


def check_kv_transfer(config: ServeConfig) -> None:
    """Prefill replicas, or ``replicas.kv_transfer=on``, need nixl here (the replicas' transport)."""
    rc = config.replicas
    if rc.kv_transfer == "on" or rc.num_prefill_replicas:
        from kvmesh.replica.kv_transfer.nixl_agent import nixl_missing

        why = nixl_missing()
        if why is not None:
            need = (f"replicas.num_prefill_replicas={rc.num_prefill_replicas}" if rc.num_prefill_replicas
                    else "replicas.kv_transfer=on")
            raise PreflightError(f"{need} moves KV between replicas over NIXL, but {why}")


def check_embedded_capacity(config: ServeConfig) -> None:
    """The embedded Ray's one node (ray.num_cpus, the GPUs Ray detects here) holds the replicas; a Ray this
    process already runs (tests' session) is checked once connected (``ServeCluster.check_capacity``)."""
    import ray
    from kvmesh.cluster.launch.placement import check_capacity, embedded_nodes, replica_bundles
    from kvmesh.cluster.launch.ray_cluster import embedded_num_cpus

    if ray.is_initialized():
        return
    try:
        nodes = embedded_nodes(embedded_num_cpus(config))
    except Exception as e:  # Ray's GPU detection is private API: checked again once Ray runs
        logger.debug("GPU detection before Ray starts failed (%s); the check runs once Ray is up", e)
        return
    device = config.engine.device or ("cuda" if nodes[0].gpus >= 1 else "cpu")
    tp = config.engine.tensor_parallel_size
    bundles = replica_bundles(tp, config.replicas.num_cpus_per_worker, device, config.gpus_per_worker)
    try:
        check_device_share(config.replicas.gpus_per_replica, device, "no GPU found on this machine")
        check_capacity(bundles, tp, config.gpus_per_worker, config.replicas.num_started, embedded=True,
                          nodes=nodes)
    except ValueError as e:  # CapacityError is one
        raise PreflightError(str(e)) from None


def check_port_free(host: str, port: int, what: str) -> None:
    """Binding ``host:port`` works now (port 0 always does); else ``PreflightError`` naming the setting."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise PreflightError(f"{what}: port {host}:{port} is not available ({e.strerror}); another kvmesh (or "
                                 "something else) uses it: stop it, or choose another port (0 = any free port)"
                                 ) from None
