"""``ServeCluster``: Ray + placement groups + replica actors + router + supervisor, up and down.

    start():  connect Ray ─▶ model on every node ─▶ the nodes hold the replicas? (capacity.py) ─▶ one
              placement group per replica ─▶ replica actors (loading; their config sections:
              replica_sections.py) ─▶ router (its config section: router_section.py; this process, or a control
              router + router.workers: cluster/launch/serve_router.py; or routers on Ray nodes: node_routers.py)
              ─▶ wait for ready, register
              endpoints with the router (readiness.py)
              ─▶ supervisor thread (restarts -> re-registration, supervisor.py) ─▶ the fleet built on the started
              cluster, when given one (``fleet``: ``kvmesh serve`` passes cluster/fleet/operations.py's ``Fleet``:
              replicas added/drained/removed at runtime, autoscaler, rolling restart); launch never names fleet/
    stop():   fleet ─▶ supervisor ─▶ router ─▶ replicas (graceful, then killed) ─▶ placement groups ─▶
              Ray (only if serve started it)

The hash seed is generated here when the config has none and reaches replicas only inside their
EngineConfig (an actor argument); the router never needs it (it keys blocks by token ids). The internal key
(the KV plane's) is generated here per run and reaches the router inside its RouterConfig and every replica,
restarted and added ones too, inside its ReplicaServerConfig.
"""

from __future__ import annotations

import functools
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from kvmesh.cluster import admin_key as admin_key_store
from kvmesh.cluster.config.roles import Role, replica_name, serving_role
from kvmesh.cluster.config.trees import ServeConfig
from kvmesh.cluster.launch import placement, preflight, ray_cluster
from kvmesh.cluster.launch.deployment_launch import DeploymentUnit, place_units, plan_units
from kvmesh.cluster.launch.embedded_model import SERVED_NAME, served_frontend
from kvmesh.cluster.launch.event_keys import curve_keys
from kvmesh.cluster.launch.model_files import resolve_model_path
from kvmesh.cluster.launch.readiness import wait_replicas_ready, wait_router_sees
from kvmesh.cluster.launch.replica_sections import (
    replica_engine,
    replica_events,
    replica_kv_transfer,
    replica_server,
)
from kvmesh.cluster.launch.router_section import router_section
from kvmesh.cluster.launch.serve_router import RouterProcesses
from kvmesh.cluster.launch.serve_state import ClusterFleet, FleetFactory, ServeState
from kvmesh.cluster.launch.supervisor import ReplicaHandle, Supervisor
from kvmesh.cluster.router_client import RouterClient
from kvmesh.replica.config import EngineConfig
from kvmesh.router.config import RouterConfig
from kvmesh.router.replicas.roles import PREFILL

if TYPE_CHECKING:
    from ray.actor import ActorHandle

logger = logging.getLogger(__name__)


class ServeCluster:
    """A whole kvmesh cluster driven from this process (see the module doc)."""

    def __init__(self, config: ServeConfig, report: Callable[[str], None] = print,
                 log_to_driver: bool = False, supervise_interval_s: float = 1.0,
                 admin_keys_dir: str | None = None, fleet: FleetFactory | None = None) -> None:
        self.config = config
        self.make_fleet = fleet
        """Builds the fleet on the started cluster (None: none; the replica set stays as started)."""
        self.admin_keys_dir = admin_keys_dir
        """Folder of the cluster records (cluster/admin_key.py; "" = the default one); None = write none."""
        self.admin_key_file: Path | None = None
        """This cluster's record (mode 0600), for `kvmesh scale/drain/rollout`; removed by stop()."""
        self.report = report
        self.log_to_driver = log_to_driver
        self.supervise_interval_s = supervise_interval_s
        self.state = ServeState()
        self.fleet: ClusterFleet | None = None
        """The fleet ``make_fleet`` built (cluster/fleet/operations.py's): runtime scaling, drains, rolling restarts."""
        self.started_at = time.monotonic()
        self.cpu_notes: tuple[str, ...] = ()
        """Lines said once when the replicas turn out to run on CPU (flags given that change nothing there)."""
        self._spawn: dict[str, Callable[[], ActorHandle]] = {}  # replica id -> makes its actor (again)
        # SECRET: the cluster's hash seed, generated here unless configured; replicas get it as an actor
        # argument, the router only the salt secret derived from it (kvcache.hashing.cache_salt_secret).
        self._hash_seed: str = config.engine.hash_seed or secrets.token_hex(32)
        # SECRET: the cluster's internal key, the KV plane's (kv_transfer_params, /kv/*): the router and every
        # replica get it inside their config sections over Ray, never on a command line or in a log.
        self._internal_key: str = secrets.token_urlsafe(32)
        # SECRET: CURVE keypairs of the replicas' event sockets and of the router that subscribes to them.
        self._curve = curve_keys() if config.replicas.private_events else None
        self.units: list[DeploymentUnit] = []
        """The deployments as their replicas start (``deployments.models``; empty: the one model of the engine
        section). cluster/launch/deployment_launch.py."""

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
        for note in self.cpu_notes if st.device == "cpu" else ():
            self.report(note)
        if cfg.deployments.models:  # several models: the first one's is the router's own (its tokenizer)
            self.units = plan_units(cfg, st.ray, st.device, self._hash_seed, self.report)
            st.model_path, st.served_model_name = self.units[0].model_path, self.units[0].served_model_name
        else:
            st.model_path = resolve_model_path(cfg, st.ray, self.report)
            st.served_model_name = cfg.router.served_name or (SERVED_NAME if cfg.is_embedded_model
                                                                     else cfg.engine.model)
        self._start_replicas()  # they load the model while the router starts
        self._start_router()
        wait_replicas_ready(st.replicas, st.router_client, cfg.ray.ready_timeout_s, self.report, lambda: self.elapsed_s)
        wait_router_sees(st.router_client, st.router, len(st.replicas))
        st.supervisor = Supervisor(st.replicas, st.router_client, interval_s=self.supervise_interval_s,
                                   report=self.report, spawn=lambda rid: self._spawn[rid]()).start()
        if self.make_fleet is not None:
            self.fleet = self.make_fleet(self).start()
            st.router.runtime.fleet = self.fleet
        return self

    def _start_router(self) -> None:
        from kvmesh.cluster.launch.serve_router import num_router_workers, start_router

        cfg, st = self.config, self.state
        admin_key = st.admin_key = secrets.token_urlsafe(32)  # the replica set is changed only by the operator
        workers = 1 if cfg.routers.placed else num_router_workers(cfg)
        router_config = self.router_config(admin_key)
        if cfg.routers.placed:  # routers on Ray nodes; the replica set stays this process's
            from kvmesh.cluster.launch.node_routers import NodeRouters

            node_host = "auto" if cfg.router.host == "auto" and not st.ray.local else router_config.host
            st.router = NodeRouters(replace(router_config, host=node_host), cfg.routers, cfg.ray.namespace,
                                    self.report).start()
        else:
            st.router = start_router(router_config, workers)
        if self.admin_keys_dir is not None:  # once the router listens: the URL of the set's owner names the record
            self.admin_key_file = admin_key_store.publish(
                st.router.control_url if cfg.routers.placed else self.url, admin_key, self.admin_keys_dir or None,
                api_key=self.config.router.api_key,
                router_secrets=admin_key_store.RouterSecrets.of(router_config))
        if cfg.routers.placed:
            self.report(f"routers: {', '.join(st.router.urls)} on Ray nodes; the replica set is owned by this "
                        f"process (control router at {st.router.control_url})")
        elif workers > 1:
            self.report(f"router: {workers} processes on {self.url}, replica set owned by the control router "
                        f"at {st.router.control_url}")
        # the supervisor and fleet change the replica set where it is owned (cluster/launch/serve_router.py)
        owner_url = st.router.control_url if isinstance(st.router, RouterProcesses) else self.url
        st.router_client = RouterClient(owner_url, api_key=cfg.router.api_key, admin_key=admin_key)

    def router_config(self, admin_key: str | None = None) -> RouterConfig:
        """The serve config's router section, plus what the router takes from the engine's (router_section.py)."""
        engine = self.units[0].engine if self.units else self.config.engine
        return router_section(self.config, self.state, engine, several_models=bool(self.units),
                              internal_key=self._internal_key, hash_seed=self._hash_seed, curve=self._curve,
                              admin_key=admin_key)

    def _start_replicas(self) -> None:
        cfg, st = self.config, self.state
        if self.units:
            return self._start_deployments()
        rc, tp = cfg.replicas, cfg.engine.tensor_parallel_size
        bundles = self.replica_bundles()
        self.check_capacity(rc.num_started)  # fail in a second, not after placement_timeout_s
        st.engine = self.engine_config()
        st.kv_transfer = replica_kv_transfer(cfg)
        roles = [serving_role(rc.num_prefill_replicas)] * rc.num_replicas + [PREFILL] * rc.num_prefill_replicas
        memory = f", gpu_memory_utilization {st.engine.gpu_memory_utilization:g} each" if st.device == "cuda" else ""
        split = f" ({rc.num_replicas} decode + {rc.num_prefill_replicas} prefill)" if rc.num_prefill_replicas else ""
        self.report(f"placing {rc.num_started} replica(s){split}: {tp} worker(s) each on "
                    f"{st.device}, bundles {bundles}, placement {cfg.ray.placement}{memory}")
        st.groups = placement.create_placement_groups(rc.num_started, bundles, cfg.ray.placement)
        placement.wait_ready(st.groups, timeout_s=cfg.ray.placement_timeout_s, report=self.report)
        for group, role in zip(st.groups, roles, strict=True):
            st.replicas.append(self.start_replica(group, role))

    def _start_deployments(self) -> None:
        """Every deployment's replicas, placement planned for all first (cluster/launch/deployment_launch.py)."""
        st = self.state
        st.engine, st.kv_transfer = self.units[0].engine, replica_kv_transfer(self.config)
        placed = place_units(self.config, self.units, st.ray.owned, self.report)
        st.groups = [group for _, group in placed]
        for unit, group in placed:
            st.replicas.append(self.start_replica(group, serving_role(0), unit))

    def replica_bundles(self) -> list[dict[str, float]]:
        cfg = self.config
        return placement.replica_bundles(cfg.engine.tensor_parallel_size, cfg.replicas.num_cpus_per_worker,
                                  self.state.device, cfg.gpus_per_worker)

    def check_capacity(self, num_replicas: int) -> None:
        """CapacityError unless the nodes hold ``num_replicas`` replicas (placement.check_serve_capacity)."""
        placement.check_serve_capacity(self.config, self.replica_bundles(), num_replicas, self.state.ray.owned,
                                       self.report)

    def start_replica(self, group: placement.ReplicaPlacement, role: Role,
                      unit: DeploymentUnit | None = None) -> ReplicaHandle:
        """Start replica ``group.replica_index``'s actor of ``role`` in its placement group (not yet ready);
        ``unit``: a replica of that deployment (its engine, served name, bundles), else of the one model.

        The hook the fleet (cluster/fleet/operations.py) adds replicas through at runtime; ports are the
        base + i (+ 2i for events), whatever the role (cluster/config/roles.py).
        """
        from kvmesh.replica.actor import ReplicaOptions, start_replica_actor
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        cfg, st = self.config, self.state
        own = unit.config if unit is not None else cfg  # a deployment's replica: its parallelism and GPU share
        rc, tp, i = cfg.replicas, own.engine.tensor_parallel_size, group.replica_index
        bundles = unit.bundles if unit is not None else self.replica_bundles()
        engine, served = (unit.engine, unit.served_model_name) if unit is not None else (st.engine,
                                                                                         st.served_model_name)
        actor_bundle = placement.actor_bundle_index(tp)
        replica_id = replica_name(i, role)
        options = ReplicaOptions(
            engine=engine, server=replica_server(cfg, i, served, st.ray.local, self._internal_key),
            events=replica_events(cfg, self._curve), frontend=served_frontend(cfg.frontend, cfg.engine.model),
            kv_transfer=st.kv_transfer,
            replica_id=replica_id, num_cpus_per_worker=rc.num_cpus_per_worker,
            placement_group=group.placement_group if tp > 1 else None)
        spawn = functools.partial(
            start_replica_actor, options, name=f"kvmesh-{replica_id}", max_restarts=rc.max_restarts,
            namespace=cfg.ray.namespace, num_cpus=bundles[actor_bundle]["CPU"],
            num_gpus=own.gpus_per_worker if st.device == "cuda" and tp == 1 else 0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                group.placement_group, placement_group_bundle_index=actor_bundle))
        self._spawn[replica_id] = spawn  # the supervisor replaces a dead replica with the same
        return ReplicaHandle(replica_id=replica_id, actor=spawn(), role=role,
                             deployment=unit.deployment.name if unit is not None else "")

    def engine_config(self) -> EngineConfig:
        """The serve config's engine section as every replica gets it (cluster/launch/replica_sections.py)."""
        st = self.state
        return replica_engine(self.config, st.model_path, st.device, self._hash_seed)

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
        if self.fleet is not None:  # first what changes the replica set, then the router it changes
            self.fleet.stop()
        if st.supervisor is not None:
            st.supervisor.stop()
        self.fleet, st.supervisor = None, None
        admin_key_store.withdraw(self.admin_key_file)
        if st.router is not None:
            st.router.stop()
        if st.router_client is not None:
            st.router_client.close()
        st.router, st.router_client = None, None
        ray_up = ray.is_initialized() and not ray_cluster.gcs_gone()  # gone: nothing left to stop in it
        if st.replicas and ray_up:
            refs = [h.actor.shutdown.remote(graceful_s) for h in st.replicas]
            ray.wait(refs, num_returns=len(refs), timeout=graceful_s + 3)
            for handle in st.replicas:
                try:
                    ray.kill(handle.actor, no_restart=True)
                except Exception as e:  # already dead
                    logger.debug("kill %s: %s", handle.replica_id, e)
        st.replicas = []
        if st.groups and ray_up:
            placement.remove_placement_groups(st.groups)
        st.groups = []
        ray_cluster.disconnect(st.ray)
        st.ray = None

