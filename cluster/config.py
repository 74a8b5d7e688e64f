"""The serve configuration: one frozen dataclass tree for a whole kvmesh cluster.

    ServeConfig
    ├── model:    ModelConfig     which model and tokenizer every replica serves
    ├── cache:    CacheConfig     KV cache: block size, memory budget, prefix caching, hash seed
    ├── replicas: ReplicaConfig   how many replicas, tensor parallelism, devices, restarts, ports
    ├── router:   RouterConfig    routing policy and weights, HTTP host/port, API key
    └── ray:      RayConfig       embedded Ray instance or an existing cluster, placement

Loaded from YAML and CLI flags by ``cluster/config_loader.py`` (defaults < YAML < environment
< flags); every section validates itself in ``__post_init__``. Secrets (``cache.hash_seed``,
``router.api_key``) are excluded from ``repr`` and redacted by ``to_dict``; the hash seed is
generated at cluster start when not configured and reaches replicas only as an actor argument.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from dataclasses import dataclass, field
from typing import Any

from kvmesh.cluster.config_checks import check as _check
from kvmesh.cluster.config_checks import check_policy as _check_policy
from kvmesh.cluster.config_checks import check_port as _check_port
from kvmesh.cluster.config_checks import parse_size
from kvmesh.kvcache.eviction import EVICTION_POLICIES

# ``model`` value that selects the tiny Llama built locally (cluster/embedded_model.py).
EMBEDDED_MODEL = "embedded"
REDACTED = "<redacted>"

_DTYPES = ("auto", "float32", "bfloat16", "float16")
_LOAD_FORMATS = ("auto", "safetensors", "dummy")
_DEVICES = ("auto", "cpu", "cuda")
_EVICTION_POLICIES = tuple(EVICTION_POLICIES)  # the kvcache registry: lru, slru, arc
_PLACEMENTS = ("spread", "pack")
@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Which model every replica serves."""

    model: str = EMBEDDED_MODEL
    """Hugging Face id, local directory, or "embedded" (a tiny Llama with random weights, built locally)."""
    tokenizer: str | None = None
    """Tokenizer id or directory; None -> the model's own."""
    served_model_name: str | None = None
    """Name clients put in "model"; None -> the model value (or "kvmesh-embedded")."""
    dtype: str = "auto"
    """Weight and activation dtype: auto, float32, bfloat16 or float16 (auto: float32 on CPU)."""
    load_format: str = "auto"
    """auto, safetensors or dummy (random weights from the model's config; "embedded" implies dummy)."""
    max_model_len: int | None = None
    """Context length in tokens; None -> the model's max_position_embeddings."""
    seed: int = 0
    """Seed for dummy weights and for sampling without a per-request seed."""

    def __post_init__(self) -> None:
        _check(bool(self.model.strip()), "model.model is empty; give a HF id, a directory or 'embedded'")
        _check(self.dtype in _DTYPES, f"model.dtype={self.dtype!r}; expected one of {', '.join(_DTYPES)}")
        _check(self.load_format in _LOAD_FORMATS,
               f"model.load_format={self.load_format!r}; expected one of {', '.join(_LOAD_FORMATS)}")
        _check(self.max_model_len is None or self.max_model_len > 0,
               f"model.max_model_len={self.max_model_len} must be positive (or null for the model's own)")

    @property
    def is_embedded(self) -> bool:
        return self.model == EMBEDDED_MODEL


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """The replicas' paged KV cache (every replica of one cluster uses the same settings)."""

    block_size: int = 16
    """Tokens per KV block; the unit of prefix reuse and of routing keys."""
    kv_cache_memory: int | str | None = None
    """KV cache budget per replica on CPU, bytes or e.g. "512MiB" (stored as bytes); None -> engine default."""
    gpu_memory_utilization: float = 0.9
    """Fraction of GPU memory a replica may use (weights + activations + KV cache)."""
    enable_prefix_caching: bool = True
    """Reuse cached blocks of earlier requests with the same prefix."""
    eviction_policy: str = "lru"
    """Which free cached block is recycled first."""
    hash_seed: str | None = field(default=None, repr=False)
    """SECRET seed of block hashes shared by all replicas; None -> generated at cluster start.
    Prefer the KVMESH_HASH_SEED environment variable to writing it in a file; never logged."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "kv_cache_memory", parse_size(self.kv_cache_memory, "cache.kv_cache_memory"))
        _check(self.block_size > 0 and self.block_size & (self.block_size - 1) == 0,
               f"cache.block_size={self.block_size} must be a positive power of two (e.g. 16)")
        _check(self.kv_cache_memory is None or self.kv_cache_memory > 0,
               f"cache.kv_cache_memory={self.kv_cache_memory} must be positive bytes (e.g. 512MiB)")
        _check(0.0 < self.gpu_memory_utilization <= 1.0,
               f"cache.gpu_memory_utilization={self.gpu_memory_utilization} must be in (0, 1]")
        _check(self.eviction_policy in _EVICTION_POLICIES,
               f"cache.eviction_policy={self.eviction_policy!r}; expected one of {', '.join(_EVICTION_POLICIES)}")
        _check(self.hash_seed is None or len(self.hash_seed) >= 16,
               "cache.hash_seed is shorter than 16 characters; use a long random secret "
               "(e.g. `python -c 'import secrets; print(secrets.token_hex(32))'`) or leave it unset")


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    """The replicas: count, tensor parallelism, devices, restarts and ports."""

    num_replicas: int = 2
    """Number of engine replicas (each a Ray actor with its own KV cache)."""
    tensor_parallel_size: int = 1
    """Workers (GPUs) per replica; a replica's workers are packed onto one node."""
    device: str = "auto"
    """auto (cuda if the node has a GPU), cpu or cuda."""
    num_cpus_per_worker: float = 1.0
    """Ray CPUs reserved per tensor-parallel worker."""
    max_num_seqs: int = 256
    """Most requests a replica runs at once."""
    max_num_batched_tokens: int = 2048
    """Token budget of one engine step (long prompts are chunked)."""
    max_restarts: int = 3
    """How often Ray restarts a replica that died (-1 = forever)."""
    http_port: int = 0
    """Replica i serves HTTP on http_port + i; 0 -> ephemeral ports reported through Ray."""
    event_port: int = 0
    """Replica i publishes events on event_port + 2i (replay on +1); 0 -> ephemeral."""

    def __post_init__(self) -> None:
        _check(self.num_replicas >= 1, f"replicas.num_replicas={self.num_replicas} must be at least 1")
        _check(self.tensor_parallel_size >= 1,
               f"replicas.tensor_parallel_size={self.tensor_parallel_size} must be at least 1")
        _check(self.device in _DEVICES, f"replicas.device={self.device!r}; expected one of {', '.join(_DEVICES)}")
        _check(self.num_cpus_per_worker > 0,
               f"replicas.num_cpus_per_worker={self.num_cpus_per_worker} must be positive")
        _check(self.max_num_seqs >= 1, f"replicas.max_num_seqs={self.max_num_seqs} must be at least 1")
        _check(self.max_num_batched_tokens >= 1,
               f"replicas.max_num_batched_tokens={self.max_num_batched_tokens} must be at least 1")
        _check(self.max_restarts >= -1, f"replicas.max_restarts={self.max_restarts}; use -1 (forever) or >= 0")
        _check_port(self.http_port, "replicas.http_port")
        _check_port(self.event_port, "replicas.event_port")


@dataclass(frozen=True, slots=True)
class RouterConfig:
    """The router: OpenAI HTTP front, routing policy and its weights."""

    policy: str = "cache_aware"
    """Routing policy from the router's registry: cache_aware, least_loaded, round_robin, random, prefix_hash."""
    policy_weights: dict[str, float] = field(default_factory=dict)
    """Numeric options passed to the policy (e.g. {decode_weight: 64.0} for cache_aware)."""
    host: str | None = None
    """Address to bind; None -> 127.0.0.1 on an embedded cluster, the node's IP in a Ray cluster."""
    port: int = 8000
    """Router HTTP port."""
    api_key: str | None = field(default=None, repr=False)
    """SECRET bearer token clients must send; None -> no auth. Prefer KVMESH_API_KEY."""

    def __post_init__(self) -> None:
        for name, weight in self.policy_weights.items():
            _check(isinstance(weight, (int, float)) and not isinstance(weight, bool),
                   f"router.policy_weights.{name}={weight!r} must be a number")
        _check_policy(self.policy, self.policy_weights)
        _check_port(self.port, "router.port", allow_zero=True)
        if self.host is not None:
            try:
                ipaddress.ip_address(self.host)
            except ValueError:
                _check(bool(re.fullmatch(r"[A-Za-z0-9.-]+", self.host)),
                       f"router.host={self.host!r} is not an IP address or host name")
        _check(self.api_key is None or len(self.api_key) >= 8,
               "router.api_key is shorter than 8 characters; use a longer secret or leave it unset")


@dataclass(frozen=True, slots=True)
class RayConfig:
    """Which Ray cluster to run on and how replicas are placed."""

    address: str | None = None
    """None -> start an embedded local Ray instance; "auto" or host:port -> join that cluster."""
    num_cpus: int | None = None
    """Logical CPUs of the embedded instance; None -> enough for all replicas and the router."""
    namespace: str = "kvmesh"
    """Ray namespace of the cluster's named actors."""
    placement: str = "spread"
    """spread: replicas round-robin over nodes (each replica's TP workers packed on one node); pack: fill nodes."""
    ready_timeout_s: float = 600.0
    """How long serve waits for every replica to become ready before giving up."""

    def __post_init__(self) -> None:
        _check(self.num_cpus is None or self.num_cpus >= 1, f"ray.num_cpus={self.num_cpus} must be at least 1")
        _check(self.placement in _PLACEMENTS,
               f"ray.placement={self.placement!r}; expected one of {', '.join(_PLACEMENTS)}")
        _check(self.ready_timeout_s > 0, f"ray.ready_timeout_s={self.ready_timeout_s} must be positive")
        _check(bool(self.namespace.strip()), "ray.namespace is empty")


@dataclass(frozen=True, slots=True)
class ServeConfig:
    """Everything `kvmesh serve` needs to run a cluster."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """Which model and tokenizer every replica serves."""
    cache: CacheConfig = field(default_factory=CacheConfig)
    """The replicas' KV cache."""
    replicas: ReplicaConfig = field(default_factory=ReplicaConfig)
    """Replica count, tensor parallelism, devices, restarts, ports."""
    router: RouterConfig = field(default_factory=RouterConfig)
    """The router's policy, address and API key."""
    ray: RayConfig = field(default_factory=RayConfig)
    """Embedded Ray or an existing cluster; placement."""

    def __post_init__(self) -> None:
        if self.model.is_embedded:
            _check(self.model.load_format in ("auto", "dummy"),
                   f"model.load_format={self.model.load_format!r} cannot load the embedded model, which "
                   "has no weight files; use load_format auto/dummy or give a real model")
        if self.router.port and self.replicas.http_port:
            top = self.replicas.http_port + self.replicas.num_replicas - 1
            _check(not self.replicas.http_port <= self.router.port <= top,
                   f"router.port={self.router.port} collides with replica HTTP ports "
                   f"{self.replicas.http_port}..{top}; move one of them")
        if self.replicas.event_port:
            top = self.replicas.event_port + 2 * self.replicas.num_replicas - 1
            _check(top <= 65535, f"replicas.event_port={self.replicas.event_port} leaves no room for "
                   f"{self.replicas.num_replicas} replicas (needs ports up to {top})")

    @property
    def is_embedded_ray(self) -> bool:
        return self.ray.address is None

    def to_dict(self, redact: bool = True) -> dict[str, Any]:
        """Plain nested dict (YAML-ready); secrets are replaced by "<redacted>" unless redact=False."""
        out = dataclasses.asdict(self)
        if redact:
            for section, key in SECRET_FIELDS:
                if out[section][key] is not None:
                    out[section][key] = REDACTED
        return out


# (section, field) of every secret: kept out of repr, logs, status pages and events.
SECRET_FIELDS = (("cache", "hash_seed"), ("router", "api_key"))
