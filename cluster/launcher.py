"""``ServeCluster``: Ray + placement groups + replica actors + router + supervisor, up and down.

    start():  connect Ray ─▶ model on every node ─▶ one placement group per replica ─▶ replica
              actors (loading) ─▶ router (this process) ─▶ wait for ready (progress) ─▶ register
              endpoints with the router ─▶ supervisor thread (restarts -> re-registration)
    stop():   supervisor ─▶ router ─▶ replicas (graceful, then killed) ─▶ placement groups ─▶
              Ray (only if serve started it)

The hash seed is generated here when the config has none and reaches replicas only inside their
EngineConfig (an actor argument); the router never needs it (it keys blocks by token ids).
"""

from __future__ import annotations

import functools
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvmesh.cluster import placement as pl
from kvmesh.cluster import ray_cluster
from kvmesh.cluster.config import ServeConfig
from kvmesh.cluster.embedded_model import SERVED_NAME
from kvmesh.cluster.model_files import resolve_model_path
from kvmesh.cluster.router_client import RouterClient
from kvmesh.cluster.supervisor import ReplicaHandle, Supervisor, register
from kvmesh.kvcache.hashing import cache_salt_secret

logger = logging.getLogger(__name__)

# KV cache per replica on CPU when the config sets none and the model is the embedded one:
# 2 KiB/token x 32k tokens -- plenty for a demo, small enough for a laptop.
EMBEDDED_KV_CACHE_MEMORY = 64 << 20


@dataclass(slots=True)
class ServeState:
    """What a running cluster consists of (for stop() and for tests)."""

    ray: Any = None
    router: Any = None
    router_client: RouterClient | None = None
    groups: list[pl.ReplicaPlacement] = field(default_factory=list)
    replicas: list[ReplicaHandle] = field(default_factory=list)
    supervisor: Supervisor | None = None
    model_path: str = ""
    served_model_name: str = ""
    device: str = "cpu"


class ServeCluster:
    """A whole kvmesh cluster driven from this process (see the module doc)."""

    def __init__(self, config: ServeConfig, report: Callable[[str], None] = print,
                 log_to_driver: bool = False, supervise_interval_s: float = 1.0) -> None:
        self.config = config
        self.report = report
        self.log_to_driver = log_to_driver
        self.supervise_interval_s = supervise_interval_s
        self.state = ServeState()
        self.started_at = time.monotonic()
        self._spawn: dict[str, Callable[[], Any]] = {}  # replica id -> makes its actor (again)
        self._salt_secret: bytes | None = None  # derived from the hash seed; the router's, not the seed

    # ------------------------------------------------------------------ start
    def start(self) -> ServeCluster:
        cfg, st = self.config, self.state
        self.started_at = time.monotonic()
        where = "a local Ray instance" if cfg.is_embedded_ray else f"the Ray cluster at {cfg.ray.address}"
        self.report(f"starting {where}" + (f" ({ray_cluster.embedded_num_cpus(cfg)} logical CPUs)"
                                           if cfg.is_embedded_ray else ""))
        st.ray = ray_cluster.connect(cfg, log_to_driver=self.log_to_driver)
        _check_port_free(ray_cluster.router_host(cfg, st.ray), cfg.router.port)  # fail before loading anything
        st.device = ray_cluster.resolve_device(cfg, st.ray)
        st.model_path = resolve_model_path(cfg, st.ray, self.report)
        st.served_model_name = cfg.model.served_model_name or (SERVED_NAME if cfg.model.is_embedded
                                                                else cfg.model.model)
        self._start_replicas()  # they load the model while the router starts
        self._start_router()
        self._wait_ready()
        st.supervisor = Supervisor(st.replicas, st.router_client, interval_s=self.supervise_interval_s,
                                   report=self.report, spawn=lambda rid: self._spawn[rid]()).start()
        return self

    def _start_router(self) -> None:
        from kvmesh.router.config import RouterConfig
        from kvmesh.router.server import RouterServer

        cfg, st = self.config, self.state
        host = ray_cluster.router_host(cfg, st.ray)
        router_config = RouterConfig(
            host=host, port=cfg.router.port, model=st.model_path, tokenizer=cfg.model.tokenizer,
            served_model_name=st.served_model_name, max_model_len=cfg.model.max_model_len,
            policy=cfg.router.policy, policy_kwargs=dict(cfg.router.policy_weights),
            block_size=cfg.cache.block_size, api_key=cfg.router.api_key, replica_api_key=cfg.router.api_key,
            cache_salt_secret=self._salt_secret)
        st.router = RouterServer(router_config).start()
        st.router_client = RouterClient(self.url, api_key=cfg.router.api_key)

    def _start_replicas(self) -> None:
        from kvmesh.replica.actor import ReplicaOptions, start_replica_actor
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        cfg, st = self.config, self.state
        rc = cfg.replicas
        bundles = pl.replica_bundles(rc.tensor_parallel_size, rc.num_cpus_per_worker, st.device)
        self.report(f"placing {rc.num_replicas} replica(s): {rc.tensor_parallel_size} worker(s) each on "
                    f"{st.device}, bundles {bundles}, placement {cfg.ray.placement}")
        st.groups = pl.create_placement_groups(rc.num_replicas, bundles, cfg.ray.placement)
        pl.wait_ready(st.groups, timeout_s=min(cfg.ray.ready_timeout_s, 300.0))
        engine = self.engine_config()
        actor_bundle = pl.actor_bundle_index(rc.tensor_parallel_size)
        tp1_gpu = st.device == "cuda" and rc.tensor_parallel_size == 1
        for group in st.groups:
            i = group.replica_index
            options = ReplicaOptions(
                engine=engine, replica_id=f"replica-{i}",
                host=ray_cluster.LOCAL_HOST if st.ray.local else None,
                http_port=rc.http_port + i if rc.http_port else 0,
                event_port=rc.event_port + 2 * i if rc.event_port else 0,
                replay_port=rc.event_port + 2 * i + 1 if rc.event_port else 0,
                api_key=cfg.router.api_key, served_model_name=st.served_model_name,
                num_cpus_per_worker=rc.num_cpus_per_worker,
                placement_group=group.placement_group if rc.tensor_parallel_size > 1 else None)
            spawn = functools.partial(
                start_replica_actor, options, name=f"kvmesh-replica-{i}", max_restarts=rc.max_restarts,
                namespace=cfg.ray.namespace, num_cpus=bundles[actor_bundle]["CPU"], num_gpus=1 if tp1_gpu else 0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    group.placement_group, placement_group_bundle_index=actor_bundle))
            self._spawn[f"replica-{i}"] = spawn  # the supervisor replaces a dead replica with the same
            st.replicas.append(ReplicaHandle(replica_id=f"replica-{i}", actor=spawn()))

    def engine_config(self) -> Any:
        """The EngineConfig every replica gets (with the cluster's secret hash seed)."""
        from kvmesh.replica.config import EngineConfig

        cfg, st = self.config, self.state
        seed = cfg.cache.hash_seed.encode() if cfg.cache.hash_seed else secrets.token_bytes(32)
        self._salt_secret = cache_salt_secret(seed)
        kv_memory = cfg.cache.kv_cache_memory
        if kv_memory is None and cfg.model.is_embedded:
            kv_memory = EMBEDDED_KV_CACHE_MEMORY
        return EngineConfig(
            model=st.model_path, tokenizer=cfg.model.tokenizer, dtype=cfg.model.dtype,
            load_format="dummy" if cfg.model.is_embedded else cfg.model.load_format,
            block_size=cfg.cache.block_size, max_model_len=cfg.model.max_model_len,
            max_num_seqs=cfg.replicas.max_num_seqs, max_num_batched_tokens=cfg.replicas.max_num_batched_tokens,
            kv_cache_memory=kv_memory, gpu_memory_utilization=cfg.cache.gpu_memory_utilization,
            enable_prefix_caching=cfg.cache.enable_prefix_caching, eviction_policy=cfg.cache.eviction_policy,
            tensor_parallel_size=cfg.replicas.tensor_parallel_size, device=st.device, seed=cfg.model.seed,
            hash_seed=seed)

    def _wait_ready(self) -> None:
        import ray

        st = self.state
        pending = {h.actor.ready.remote(): h for h in st.replicas}
        deadline = time.monotonic() + self.config.ray.ready_timeout_s
        last_note = time.monotonic()
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
            for ref in done:
                handle = pending.pop(ref)
                try:
                    handle.endpoints = ray.get(ref)
                except Exception as e:
                    raise RuntimeError(f"{handle.replica_id} failed to start: {_first_line(e)}") from e
                handle.up = True
                register(st.router_client, handle)
                ready = len(st.replicas) - len(pending)
                self.report(f"{handle.replica_id} ready ({ready}/{len(st.replicas)}) at "
                            f"{handle.endpoints['http_url']}, events {handle.endpoints.get('events_endpoint')} "
                            f"[{self.elapsed_s:.1f}s]")
            now = time.monotonic()
            if pending and now - last_note >= 10:
                last_note = now
                self.report(f"waiting for {len(pending)} replica(s) to load the model... [{self.elapsed_s:.0f}s]")
            if pending and now > deadline:
                raise TimeoutError(f"{len(pending)} replica(s) not ready after {self.config.ray.ready_timeout_s:.0f}s "
                                   "(ray.ready_timeout_s); see the Ray logs (serve --verbose shows them)")
        self._wait_router_sees_all()

    def _wait_router_sees_all(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        want = len(self.state.replicas)
        while time.monotonic() < deadline:
            healthy = self.state.router_client.health().get("healthy_replicas", [])
            if len(healthy) >= want:
                return
            time.sleep(0.1)
        raise TimeoutError(f"the router sees {len(healthy)} of {want} replicas healthy after {timeout_s:.0f}s")

    # ------------------------------------------------------------------ info
    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started_at

    @property
    def url(self) -> str:
        return self.state.router.url

    def curl_line(self) -> str:
        auth = ' -H "Authorization: Bearer $KVMESH_API_KEY"' if self.config.router.api_key else ""
        body = f'{{"model": "{self.state.served_model_name}", "prompt": "Once upon a time", "max_tokens": 16}}'
        return f"curl -s {self.url}/v1/completions -H 'Content-Type: application/json'{auth} -d '{body}'"

    # ------------------------------------------------------------------ stop
    def stop(self, graceful_s: float = 2.0) -> None:
        """Tear everything down (safe to call twice, and after a failed start)."""
        import ray

        st = self.state
        if st.supervisor is not None:
            st.supervisor.stop()
            st.supervisor = None
        if st.router is not None:
            st.router.stop()
            st.router = None
        if st.router_client is not None:
            st.router_client.close()
            st.router_client = None
        if st.replicas and ray.is_initialized():
            refs = [h.actor.shutdown.remote(graceful_s) for h in st.replicas]
            ray.wait(refs, num_returns=len(refs), timeout=graceful_s + 3)
            for handle in st.replicas:
                try:
                    ray.kill(handle.actor, no_restart=True)
                except Exception as e:  # already dead
                    logger.debug("kill %s: %s", handle.replica_id, e)
        st.replicas = []
        if st.groups and ray.is_initialized():
            pl.remove_placement_groups(st.groups)
        st.groups = []
        ray_cluster.disconnect(st.ray)
        st.ray = None


def _check_port_free(host: str, port: int) -> None:
    import socket

    if port == 0:
        return
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise RuntimeError(f"router port {host}:{port} is not available ({e.strerror}); another kvmesh "
                               f"(or something else) is using it: stop it or pass --port") from None


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    interesting = [line for line in text if "Error" in line and not line.startswith(" ")]
    return (interesting[-1] if interesting else (text[0] if text else type(e).__name__))[:500]



