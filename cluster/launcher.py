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
from dataclasses import dataclass, field, replace
from typing import Any

from kvmesh.cluster import placement as pl
from kvmesh.cluster import preflight, ray_cluster
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
        # SECRET: the cluster's hash seed, generated here unless configured; replicas get it as an actor
        # argument, the router only the salt secret derived from it (kvcache.hashing.cache_salt_secret).
        self._hash_seed: str = config.engine.hash_seed or secrets.token_hex(32)
        # SECRET: CURVE keypairs of the replicas' event sockets and of the router that subscribes to them.
        self._curve = _curve_keys() if config.replicas.private_events else None

    # ------------------------------------------------------------------ start
    def start(self) -> ServeCluster:
        cfg, st = self.config, self.state
        self.started_at = time.monotonic()
        preflight.check(cfg)  # model, ports: fail in a second, before Ray starts
        where = "a local Ray instance" if cfg.is_embedded_ray else f"the Ray cluster at {cfg.ray.address}"
        self.report(f"starting {where}" + (f" ({ray_cluster.embedded_num_cpus(cfg)} logical CPUs)"
                                           if cfg.is_embedded_ray else ""))
        st.ray = ray_cluster.connect(cfg, log_to_driver=self.log_to_driver)
        preflight.check_port_free(ray_cluster.router_host(cfg, st.ray), cfg.router.port, "router.port")
        st.device = ray_cluster.resolve_device(cfg, st.ray)
        st.model_path = resolve_model_path(cfg, st.ray, self.report)
        st.served_model_name = cfg.router.served_model_name or (SERVED_NAME if cfg.is_embedded_model
                                                                 else cfg.engine.model)
        self._start_replicas()  # they load the model while the router starts
        self._start_router()
        self._wait_ready()
        st.supervisor = Supervisor(st.replicas, st.router_client, interval_s=self.supervise_interval_s,
                                   report=self.report, spawn=lambda rid: self._spawn[rid]()).start()
        return self

    def _start_router(self) -> None:
        from kvmesh.router.server import RouterServer

        cfg, st = self.config, self.state
        admin_key = secrets.token_urlsafe(32)  # the replica set is changed only by this process (never tenants)
        st.router = RouterServer(self.router_config(admin_key)).start()
        st.router_client = RouterClient(self.url, api_key=cfg.router.api_key, admin_key=admin_key)

    def router_config(self, admin_key: str | None = None) -> Any:
        """The serve config's router section, plus what the router takes from the engine's."""
        cfg, st = self.config, self.state
        return replace(cfg.router, host=ray_cluster.router_host(cfg, st.ray), model=st.model_path,
                       tokenizer=cfg.engine.tokenizer, served_model_name=st.served_model_name,
                       max_model_len=cfg.engine.max_model_len, block_size=cfg.engine.block_size,
                       replica_api_key=cfg.router.api_key, admin_key=admin_key,
                       frontend=cfg.frontend, cache_salt_secret=cache_salt_secret(self._hash_seed),
                       **self._curve.router if self._curve else {})

    def _start_replicas(self) -> None:
        from kvmesh.replica.actor import ReplicaOptions, start_replica_actor
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        cfg, st = self.config, self.state
        rc, tp = cfg.replicas, cfg.engine.tensor_parallel_size
        bundles = pl.replica_bundles(tp, rc.num_cpus_per_worker, st.device)
        self.report(f"placing {rc.num_replicas} replica(s): {tp} worker(s) each on "
                    f"{st.device}, bundles {bundles}, placement {cfg.ray.placement}")
        st.groups = pl.create_placement_groups(rc.num_replicas, bundles, cfg.ray.placement)
        pl.wait_ready(st.groups, timeout_s=min(cfg.ray.ready_timeout_s, 300.0))
        engine = self.engine_config()
        actor_bundle = pl.actor_bundle_index(tp)
        http_ports, event_ports = rc.http_ports(), rc.event_ports()
        for group in st.groups:
            i = group.replica_index
            options = ReplicaOptions(
                engine=engine, replica_id=f"replica-{i}",
                host=ray_cluster.LOCAL_HOST if st.ray.local else None,
                http_port=http_ports[i], event_port=event_ports[i][0], replay_port=event_ports[i][1],
                api_key=cfg.router.api_key, served_model_name=st.served_model_name, frontend=cfg.frontend,
                num_cpus_per_worker=rc.num_cpus_per_worker,
                placement_group=group.placement_group if tp > 1 else None)
            spawn = functools.partial(
                start_replica_actor, options, name=f"kvmesh-replica-{i}", max_restarts=rc.max_restarts,
                namespace=cfg.ray.namespace, num_cpus=bundles[actor_bundle]["CPU"],
                num_gpus=1 if st.device == "cuda" and tp == 1 else 0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    group.placement_group, placement_group_bundle_index=actor_bundle))
            self._spawn[f"replica-{i}"] = spawn  # the supervisor replaces a dead replica with the same
            st.replicas.append(ReplicaHandle(replica_id=f"replica-{i}", actor=spawn()))

    def engine_config(self) -> Any:
        """The serve config's engine section as every replica gets it (with the cluster's secret hash seed)."""
        cfg, st = self.config, self.state
        engine = cfg.engine
        return replace(
            engine, model=st.model_path, device=st.device, kv_events_topic=cfg.events.topic,
            load_format="dummy" if cfg.is_embedded_model else engine.load_format,
            kv_cache_memory=EMBEDDED_KV_CACHE_MEMORY if engine.kv_cache_memory is None and cfg.is_embedded_model
            else engine.kv_cache_memory,
            hash_seed=self._hash_seed, **self._curve.replicas if self._curve else {})

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


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    interesting = [line for line in text if "Error" in line and not line.startswith(" ")]
    return (interesting[-1] if interesting else (text[0] if text else type(e).__name__))[:500]


@dataclass(frozen=True)
class _CurveKeys:
    """The config fields that make a cluster's event streams private (events/curve.py)."""

    replicas: dict[str, Any]
    router: dict[str, Any]


def _curve_keys() -> _CurveKeys:
    from kvmesh.events.curve import generate_keypair

    server_public, server_secret = generate_keypair()
    router_public, router_secret = generate_keypair()
    return _CurveKeys(
        replicas={"kv_events_curve_secret_key": server_secret, "kv_events_curve_client_keys": (router_public,)},
        router={"events_curve_server_key": server_public, "events_curve_public_key": router_public,
                "events_curve_secret_key": router_secret})
