"""The config trees of the ``kvmesh`` commands, built from the components' own config dataclasses.

    ServeConfig (kvmesh serve)                      ReplicaCommandConfig (kvmesh replica)
    ├── engine:      EngineConfig      replica/     ├── engine:      EngineConfig
    ├── replicas:    ReplicasConfig    here         ├── server:      ReplicaServerConfig  replica/
    ├── router:      RouterConfig      router/      ├── events:      PublisherConfig
    ├── events:      PublisherConfig   events/      ├── frontend:    FrontendConfig
    ├── frontend:    FrontendConfig    replica/openai/ └── kv_transfer: KVTransferConfig  replica/kv_transfer/
    ├── kv_transfer: KVTransferConfig  replica/kv_transfer/
    ├── ray:         RayConfig         here         RouterCommandConfig (kvmesh router)
    └── autoscale:   AutoscaleConfig   autoscale.py ├── router:   RouterConfig
                                                    └── frontend: FrontendConfig

A section is the component's dataclass itself, and the component takes it whole
(``ReplicaRuntime.start(engine, server, events, frontend)``), so a field, its default, its check
and its doc exist once; ``schema.py`` derives YAML keys, ``KVMESH_*`` variables and flags
from them. Fields one command derives from another (the router's block size is the engine's in
``serve``) are listed in that command's hidden map with the reason, and rejected if set there.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

from kvmesh.cluster.config.autoscale import AutoscaleConfig
from kvmesh.cluster.config.deployments import DeploymentsConfig, check_deployments
from kvmesh.cluster.config.gpu_share import check_device_share, check_gpu_share, gpus_per_worker
from kvmesh.cluster.config.router_nodes import RouterNodesConfig, check_router_nodes
from kvmesh.cluster.config.schema import Schema, Tree, to_dict
from kvmesh.events.config import PublisherConfig
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.kv_transfer.config import KVTransferConfig
from kvmesh.replica.openai.config import FrontendConfig
from kvmesh.replica.server.config import ReplicaServerConfig
from kvmesh.router.config import RouterConfig

# ``engine.model`` value that selects the tiny Llama built locally (cluster/launch/embedded_model.py).
EMBEDDED_MODEL = "embedded"
_PLACEMENTS = ("spread", "pack")
KV_TRANSFER_MODES = ("auto", "on", "off")
_MIN_HASH_SEED_CHARS = 16


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _check_port(port: int, what: str) -> None:
    _check(0 <= port <= 65535, f"{what}={port} is not a TCP port; use 0..65535 (0 = ephemeral)")


def check_hash_seed(seed: str | None) -> None:
    _check(seed is None or len(seed) >= _MIN_HASH_SEED_CHARS,
           f"engine.hash_seed is shorter than {_MIN_HASH_SEED_CHARS} characters; use a long random secret "
           "(e.g. `python -c 'import secrets; print(secrets.token_hex(32))'`) or leave it unset")


@dataclass(frozen=True, slots=True)
class ReplicasConfig:
    """How many replicas ``kvmesh serve`` runs, their restarts, CPUs and ports."""

    num_replicas: int = 2
    """Number of engine replicas (each a Ray actor with its own KV cache); they decode (role decode) when there are
    prefill replicas, else they do both (role both)."""
    num_prefill_replicas: int = 0
    """Replicas of role prefill, next to num_replicas: they compute long prompts and hand the KV to a decode replica
    (the router's pd_min_uncached_tokens decides which prompts); 0 = no prefill/decode split."""
    kv_transfer: str = "auto"
    """KV moved between replicas over NIXL (prefill/decode split, peer prefix pulls): auto = on when there are
    prefill replicas; on (also peer pulls without prefill replicas: an agent per replica for at most ~0.4 points of
    hit rate behind cache_aware in the simulator); off."""
    num_cpus_per_worker: float = 1.0
    """Ray CPUs reserved per tensor-parallel worker."""
    gpus_per_replica: float | None = None
    """GPUs a replica holds on CUDA; a fraction (0.5, 0.33) packs several replicas on one GPU, and the default
    gpu_memory_utilization becomes that share (a value you set is each replica's own); None -> a GPU per TP worker."""
    max_restarts: int = 3
    """How often Ray restarts a replica that died (-1 = forever)."""
    http_port: int = 8100
    """Replica i serves HTTP on http_port + i; 0 -> ephemeral ports reported through Ray."""
    event_port: int = 5557
    """Replica i publishes KV events on event_port + 2i and answers replay on + 2i + 1; 0 -> ephemeral."""
    private_events: bool = True
    """Encrypt and authenticate the replicas' KV event streams with CURVE keys serve generates for itself
    and its router; false: plain vLLM-format streams that any subscriber who can reach the ports reads."""

    def __post_init__(self) -> None:
        _check(self.num_replicas >= 1, f"replicas.num_replicas={self.num_replicas} must be at least 1")
        _check(self.num_prefill_replicas >= 0,
               f"replicas.num_prefill_replicas={self.num_prefill_replicas} must be 0 (no split) or more")
        _check(self.kv_transfer in KV_TRANSFER_MODES,
               f"replicas.kv_transfer={self.kv_transfer!r}; expected one of {', '.join(KV_TRANSFER_MODES)}")
        _check(not (self.num_prefill_replicas and self.kv_transfer == "off"),
               f"replicas.num_prefill_replicas={self.num_prefill_replicas} needs the KV transfer (prefill replicas "
               "hand their KV over it), but replicas.kv_transfer=off; use auto/on or no prefill replicas")
        _check(self.num_cpus_per_worker > 0, f"replicas.num_cpus_per_worker={self.num_cpus_per_worker} must be > 0")
        _check(self.max_restarts >= -1, f"replicas.max_restarts={self.max_restarts}; use -1 (forever) or >= 0")
        _check_port(self.http_port, "replicas.http_port")
        _check_port(self.event_port, "replicas.event_port")

    @property
    def num_started(self) -> int:
        """Replicas serve starts: num_replicas + num_prefill_replicas."""
        return self.num_replicas + self.num_prefill_replicas

    def http_ports(self, count: int | None = None) -> list[int]:
        """HTTP port of replicas 0..count-1 (count defaults to num_replicas)."""
        return [self.http_port + i if self.http_port else 0 for i in range(count or self.num_replicas)]

    def event_ports(self, count: int | None = None) -> list[tuple[int, int]]:
        """(PUB, replay) port of replicas 0..count-1 (count defaults to num_replicas)."""
        base = self.event_port
        return [(base + 2 * i, base + 2 * i + 1) if base else (0, 0) for i in range(count or self.num_replicas)]


@dataclass(frozen=True, slots=True)
class RayConfig:
    """Which Ray cluster to run on and how replicas are placed."""

    address: str | None = None
    """None -> start an embedded local Ray instance; "auto" or host:port -> join that cluster."""
    num_cpus: int | None = None
    """Logical CPUs of the embedded instance; None -> replicas x TP x num_cpus_per_worker + 1 for the driver."""
    namespace: str = "kvmesh"
    """Ray namespace of the cluster's named actors."""
    placement: str = "spread"
    """spread: replicas round-robin over nodes (each replica's TP workers packed on one node); pack: fill nodes."""
    ready_timeout_s: float = 600.0
    """How long serve waits for every replica to become ready before giving up."""
    placement_timeout_s: float = 300.0
    """Longest wait for Ray to place the replicas' placement groups (progress shown), then a clear error."""
    wait_for_nodes: bool = False
    """The cluster adds nodes on demand (a Ray autoscaler, deploy/*.yaml): when its nodes cannot hold the replicas,
    wait up to placement_timeout_s for new ones instead of failing at once."""

    def __post_init__(self) -> None:
        _check(self.num_cpus is None or self.num_cpus >= 1, f"ray.num_cpus={self.num_cpus} must be at least 1")
        _check(self.placement in _PLACEMENTS,
               f"ray.placement={self.placement!r}; expected one of {', '.join(_PLACEMENTS)}")
        _check(self.ready_timeout_s > 0, f"ray.ready_timeout_s={self.ready_timeout_s} must be positive")
        _check(self.placement_timeout_s > 0, f"ray.placement_timeout_s={self.placement_timeout_s} must be positive")
        _check(bool(self.namespace.strip()), "ray.namespace is empty")


@dataclass(frozen=True, slots=True)
class ServeConfig:
    """Everything `kvmesh serve` needs to run a cluster."""

    engine: EngineConfig = field(default_factory=lambda: EngineConfig(model=EMBEDDED_MODEL))
    """The engine every replica runs: model, KV cache, scheduler budgets, tensor parallelism."""
    replicas: ReplicasConfig = field(default_factory=ReplicasConfig)
    """Replica count, restarts and ports."""
    router: RouterConfig = field(default_factory=lambda: RouterConfig(host="auto", workers=0))
    """The router: address, policy, API key (also required by the replicas), retries."""
    events: PublisherConfig = field(default_factory=PublisherConfig)
    """The replicas' KV event streams."""
    frontend: FrontendConfig = field(default_factory=FrontendConfig)
    """The OpenAI front of the router and every replica: body/prompt limits, chat template, read timeouts."""
    kv_transfer: KVTransferConfig = field(default_factory=KVTransferConfig)
    """The replicas' KV transfer (lease TTL, timeouts); whether it is on is replicas.kv_transfer."""
    ray: RayConfig = field(default_factory=RayConfig)
    """Embedded Ray or an existing cluster; placement."""
    autoscale: AutoscaleConfig = field(default_factory=AutoscaleConfig)
    """Replicas that follow the traffic: bounds, target load per replica, delays."""
    deployments: DeploymentsConfig = field(default_factory=DeploymentsConfig)
    """Several models behind the one router (cluster/config/deployments.py); empty: the engine section's model."""
    routers: RouterNodesConfig = field(default_factory=RouterNodesConfig)
    """Routers on several Ray nodes, each serving router.port on its node (cluster/config/router_nodes.py)."""

    def __post_init__(self) -> None:
        check_hash_seed(self.engine.hash_seed)
        check_deployments(self)
        check_router_nodes(self.routers, self.router.workers)
        check_gpu_share(self.replicas.gpus_per_replica, self.engine.tensor_parallel_size,
                        self.engine.gpu_memory_utilization)
        if self.engine.device == "cpu":
            check_device_share(self.replicas.gpus_per_replica, "cpu", "engine.device=cpu")
        if self.autoscale.scale_with_load:
            a = self.autoscale
            _check(a.min_replicas <= self.replicas.num_replicas <= a.max_replicas,
                   f"replicas.num_replicas={self.replicas.num_replicas} is outside autoscale.min_replicas="
                   f"{a.min_replicas}..autoscale.max_replicas={a.max_replicas}; it is the count serve starts with")
        if self.is_embedded_model:
            _check(self.engine.load_format in ("auto", "dummy"),
                   f"engine.load_format={self.engine.load_format!r} cannot load the embedded model, which has "
                   "no weight files; use load_format auto/dummy or give a real model")
        if self.router.host != "auto":
            try:
                ipaddress.ip_address(self.router.host)
            except ValueError:
                _check(bool(re.fullmatch(r"[A-Za-z0-9.-]+", self.router.host)),
                       f"router.host={self.router.host!r} is not an address, a host name or 'auto'")
        most = self.max_replica_slots
        used = {"router.port": [self.router.port] if self.router.port else [],
                "replicas.http_port": [p for p in self.replicas.http_ports(most) if p],
                "replicas.event_port": [p for pair in self.replicas.event_ports(most) for p in pair if p]}
        _check(max((max(p) for p in used.values() if p), default=0) <= 65535,
               f"replica ports run past 65535 for {most} replicas; lower the base ports")
        names = list(used)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                both = sorted(set(used[a]) & set(used[b]))
                _check(not both, f"{a} and {b} both use port {both[0] if both else ''}; move one of them")

    @property
    def max_replica_slots(self) -> int:
        """Most replicas alive at once: the largest count it may scale to, the prefill replicas, plus one a rolling
        restart adds."""
        top = max(self.replicas.num_replicas, self.autoscale.max_replicas if self.autoscale.scale_with_load else 0)
        return top + self.replicas.num_prefill_replicas + 1

    @property
    def gpus_per_worker(self) -> float:
        """Ray GPUs in each tensor-parallel worker's bundle on CUDA (``replicas.gpus_per_replica`` / TP)."""
        return gpus_per_worker(self.replicas.gpus_per_replica, self.engine.tensor_parallel_size)

    @property
    def is_embedded_model(self) -> bool:
        return self.engine.model == EMBEDDED_MODEL

    @property
    def is_embedded_ray(self) -> bool:
        return self.ray.address is None

    def to_dict(self, redact: bool = True) -> Tree:
        """Plain nested dict (YAML-ready); secrets are replaced by "<redacted>" unless redact=False."""
        return to_dict(self, redact)


@dataclass(frozen=True, slots=True)
class ReplicaCommandConfig:
    """Everything `kvmesh replica` needs to serve one replica."""

    engine: EngineConfig
    """The engine: model, KV cache, scheduler budgets, tensor parallelism."""
    server: ReplicaServerConfig = field(default_factory=ReplicaServerConfig)
    """HTTP and event addresses, API key."""
    events: PublisherConfig = field(default_factory=PublisherConfig)
    """The KV event stream."""
    frontend: FrontendConfig = field(default_factory=FrontendConfig)
    """The OpenAI front: body/prompt limits, chat template, read timeouts."""
    kv_transfer: KVTransferConfig = field(default_factory=KVTransferConfig)
    """Moving KV blocks between replicas (off by default): transport, lease TTL, timeouts."""

    def __post_init__(self) -> None:
        check_hash_seed(self.engine.hash_seed)
        if self.kv_transfer.enabled and self.server.internal_key is None and not self.server.is_loopback:
            raise ValueError(
                f"kv_transfer is on and server.host={self.server.host!r} is reachable from other hosts, but no "
                "internal key is set: anyone reaching the replica could lease, read and plant KV. Give the key "
                "the router and the other replicas hold with --internal-key or KVMESH_INTERNAL_KEY (kvmesh serve "
                "makes one itself), or bind to 127.0.0.1")


@dataclass(frozen=True, slots=True)
class RouterCommandConfig:
    """Everything `kvmesh router` needs besides its replicas."""

    router: RouterConfig = field(default_factory=RouterConfig)
    """The router: address, model (for its tokenizer), policy, API keys, retries."""
    frontend: FrontendConfig = field(default_factory=FrontendConfig)
    """The OpenAI front: body/prompt limits, chat template, read timeouts."""


_ALIASES = "give several names to served_model_name (--served-model-name a b): the first is the one reported"
ROUTER_FIXED = {"router.sessions.max_sessions": "the session table holds at most 100,000 pins (a setting of "
                                                "router/routing/session.py, not of the command line)"}
"""Fields of the router's sections that no command sets (they had no key before the sections were cut)."""
_EVENTS_DERIVED = "the replicas' event addresses come from replicas.event_port"
_SERVER_EVENTS = "set server.event_port or server.events_endpoint"
_FRONTEND = "set the frontend section"
_CURVE = "serve generates the event streams' CURVE keys (replicas.private_events)"
SERVE_SCHEMA = Schema(ServeConfig, hidden=ROUTER_FIXED | {
    "events.curve_secret_key": _CURVE, "events.curve_client_keys": _CURVE,
    "router.events.curve_server_key": _CURVE, "router.events.curve_public_key": _CURVE,
    "router.events.curve_secret_key": _CURVE,
    "router.model": "the router uses engine.model", "router.tokenizer": "the router uses engine.tokenizer",
    "router.max_model_len": "the router uses engine.max_model_len",
    "router.block_size": "the router uses engine.block_size",
    "router.upstream.replica_api_key": "the replicas require router.api_key", "router.frontend": _FRONTEND,
    "router.admin_key": "serve generates the admin key for its own processes",
    "router.internal_key": "serve generates the internal key for the router and its replicas",
    "router.cache_salt_secret":
        "serve derives it from engine.hash_seed (its cluster record holds it for other routers)",
    "events.endpoint": _EVENTS_DERIVED, "events.replay_endpoint": _EVENTS_DERIVED,
    "kv_transfer.enabled": "serve turns it on as replicas.kv_transfer says (auto: when there are prefill replicas)",
    "kv_transfer.transport": "serve's replicas move KV over nixl (the local transport works only inside one process)",
})
REPLICA_SCHEMA = Schema(ReplicaCommandConfig, hidden={
    "events.endpoint": _SERVER_EVENTS, "events.replay_endpoint": "set server.replay_port",
    "server.served_model_aliases": _ALIASES,
})
ROUTER_SCHEMA = Schema(RouterCommandConfig, hidden=ROUTER_FIXED | {"router.frontend": _FRONTEND})
