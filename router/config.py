"""Router configuration and the ``--replica URL[,events=...,replay=...]`` spec."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvmesh.router.policies import DEFAULT_POLICY, POLICIES


@dataclass(slots=True)
class ReplicaSpec:
    """Where one replica listens: its HTTP base URL and, optionally, its KV event endpoints."""

    url: str
    """HTTP base URL, e.g. ``http://127.0.0.1:8100`` (no trailing ``/v1``)."""
    events: str | None = None
    """ZeroMQ PUB endpoint of its KV events, e.g. ``tcp://127.0.0.1:5557``; None = no cache awareness."""
    replay: str | None = None
    """ZeroMQ replay/snapshot endpoint, e.g. ``tcp://127.0.0.1:5558``; None = no gap recovery."""
    replica_id: str = ""
    """Name used in metrics and the index; defaults to the URL."""

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/")
        if self.url.endswith("/v1"):
            self.url = self.url[:-3]
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"replica URL {self.url!r} must start with http:// or https://")
        for name in ("events", "replay"):
            value = getattr(self, name)
            if value is not None and "://" not in value:
                raise ValueError(f"replica {name} endpoint {value!r} must look like tcp://HOST:PORT")
        if not self.replica_id:
            self.replica_id = self.url

    @classmethod
    def parse(cls, text: str) -> ReplicaSpec:
        """``URL[,events=tcp://H:P][,replay=tcp://H:P][,name=ID]`` -> ReplicaSpec."""
        url, *options = [part.strip() for part in text.split(",")]
        kwargs: dict[str, str] = {}
        for option in options:
            key, sep, value = option.partition("=")
            if not sep or key not in ("events", "replay", "name"):
                raise ValueError(f"bad replica option {option!r} in {text!r}; "
                                 "use URL[,events=tcp://HOST:PORT][,replay=tcp://HOST:PORT][,name=ID]")
            kwargs["replica_id" if key == "name" else key] = value
        return cls(url=url, **kwargs)


@dataclass(slots=True)
class RouterConfig:
    """How the router listens, decides and talks to replicas."""

    host: str = "127.0.0.1"
    """Address to bind; loopback by default (never 0.0.0.0 unless asked)."""
    port: int = 8000
    """HTTP port; 0 picks a free one."""
    model: str | None = None
    """Model path or hub id whose tokenizer the replicas use (needed for cache-aware routing)."""
    tokenizer: str | None = None
    """Tokenizer path if different from ``model``."""
    served_model_name: str | None = None
    """Name clients send in "model" (requests naming another model get 404); None accepts any."""
    max_model_len: int | None = None
    """Context length for validating requests; None = the model's."""
    policy: str = DEFAULT_POLICY
    """Routing policy name (router/policies)."""
    policy_kwargs: dict = field(default_factory=dict)
    """Options of the policy (decode_weight, temperature, ...)."""
    block_size: int = 16
    """Tokens per KV block; must equal the replicas' block size."""
    api_key: str | None = field(default=None, repr=False)
    """Bearer token clients must send on /v1/* routes; None disables auth."""
    replica_api_key: str | None = field(default=None, repr=False)
    """Bearer token sent to replicas, if they require one."""
    predict_ttl_s: float = 2.0
    """Seconds a routed request's blocks count as cached on its replica before events confirm them."""
    poll_interval_s: float = 0.5
    """Seconds between polls of each replica's /load (or /health), which also probe dead ones back."""
    connect_timeout_s: float = 2.0
    """Seconds to wait for a replica connection before trying another replica."""
    request_timeout_s: float | None = 600.0
    """Seconds a forwarded request may take in total (None = no limit)."""
    max_attempts: int = 3
    """Replicas tried per request when the chosen one fails before its first byte."""
    max_body_bytes: int = 32 << 20
    """Largest request body accepted (413 above)."""
    chat_template: str | None = None
    """Jinja chat template (text or a file path) replacing the model's; must be the replicas' too."""
    tokenize_cache_tokens: int = 1 << 20
    """Token ids the router's tokenize cache keeps (router/tokenize_cache.py); 0 turns the cache off."""
    workers: int = 1
    """Router processes serving the port (router/workers.py); each has its own index and load view."""

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port={self.port} is not a TCP port; use 0..65535 (0 = ephemeral)")
        if self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r}; choose one of {sorted(POLICIES)}")
        if self.block_size <= 0:
            raise ValueError(f"block_size must be positive, got {self.block_size}")
        if self.tokenize_cache_tokens < 0:
            raise ValueError(f"tokenize_cache_tokens must be >= 0, got {self.tokenize_cache_tokens}")
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.poll_interval_s <= 0 or self.connect_timeout_s <= 0:
            raise ValueError("poll_interval_s and connect_timeout_s must be positive")
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key is empty; give a secret or leave it unset")
