"""Router configuration (the ``--replica`` spec it reads: router/replicas/spec.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvmesh.events.config import SubscriberConfig
from kvmesh.kvcache.hashing import check_salt_secret
from kvmesh.replica.openai.config import FrontendConfig, check_api_key, check_internal_key
from kvmesh.replica.openai.responses_api.store_config import ResponsesStoreConfig
from kvmesh.replica.serving.model_names import split_served_names
from kvmesh.router.admission.config import AdmissionConfig
from kvmesh.router.replicas.spec import (
    ReplicaSpec as ReplicaSpec,  # the --replica spec, read with the configuration
)
from kvmesh.router.routing.kv_placement import KVPlacementRules
from kvmesh.router.routing.outlier import OutlierConfig
from kvmesh.router.routing.policies import DEFAULT_POLICY, PolicyConfig, PolicyOptions, policy_config
from kvmesh.router.routing.session import SessionConfig

if TYPE_CHECKING:
    from kvmesh.router.routing.kv_router import KVRouter
    from kvmesh.router.routing.policies import Policy


@dataclass(slots=True)
class UpstreamConfig:
    """How the router talks to its replicas: polls, deadlines, attempts, its key (``RouterConfig.upstream``; flags and
    variables keep their flat names: ``--connect-timeout-s``, ``KVMESH_ROUTER_MAX_ATTEMPTS``)."""

    poll_interval_s: float = 0.5
    """Seconds between polls of each replica's /load (or /health), which also probe dead ones back."""
    connect_timeout_s: float = 2.0
    """Seconds to wait for a replica connection before trying another replica."""
    request_timeout_s: float | None = 600.0
    """Seconds a forwarded request may take in total (None = no limit)."""
    max_attempts: int = 3
    """Replicas tried per request when the chosen one fails before its first byte."""
    migration_limit: int = 3
    """Times one stream may move to another replica when its replica fails mid-way (router/http/migration.py);
    0 turns migration off (as Dynamo's ``--migration-limit``)."""
    first_byte_timeout_s: float | None = 20.0
    """Seconds a replica may take to start answering (its first body bytes) before the request is retried on
    another replica; extended while the replica shows progress (bytes of other answers, its /load prefill queue
    shrinking, its KV events moving), so a slow but working replica is waited for (up to request_timeout_s).
    None: only request_timeout_s."""
    stream_idle_timeout_s: float | None = 20.0
    """Seconds a stream may go without a byte from its replica before it moves to another replica (or ends with
    an error event); the miss counts against the replica only if it showed no progress meanwhile. None: only
    request_timeout_s."""
    load_missing_adapters: bool = True
    """A LoRA adapter's request may go to a replica of its base model that lacks the adapter: the router loads it
    there first (``POST /v1/load_lora_adapter`` with the internal key; router/control/adapter_loads.py); False:
    only replicas that have it serve it."""
    adapter_load_timeout_s: float = 30.0
    """Seconds one adapter load on a replica may take before the request tries another replica."""
    kv_peers_renew_s: float = 10.0
    """Seconds between the router's registrations of its replica set on the replicas with KV transfer on (POST
    /kv/peers, router/control/kv_peers.py); a replica drops the set of a router that missed three."""
    replica_api_key: str | None = field(default=None, repr=False, metadata={"cli": True})
    """Bearer token sent to replicas, if they require one (and no internal_key is set)."""

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.migration_limit < 0:
            raise ValueError(f"migration_limit must be >= 0 (0 = no stream migration), got {self.migration_limit}")
        for name, value in (("first_byte_timeout_s", self.first_byte_timeout_s),
                            ("stream_idle_timeout_s", self.stream_idle_timeout_s)):
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be positive seconds (or None for no deadline), got {value}")
        if self.poll_interval_s <= 0 or self.connect_timeout_s <= 0:
            raise ValueError("poll_interval_s and connect_timeout_s must be positive")
        if not 0 < self.kv_peers_renew_s <= 1200:  # 3 renewals: a replica keeps a registration an hour at most
            raise ValueError(f"kv_peers_renew_s must be in (0, 1200] seconds, got {self.kv_peers_renew_s}")
        if not self.adapter_load_timeout_s > 0:
            raise ValueError(f"adapter_load_timeout_s must be positive seconds, got {self.adapter_load_timeout_s}")
        if self.replica_api_key is not None and not self.replica_api_key:
            raise ValueError("replica_api_key is empty; give the replicas' key or leave it unset")


@dataclass(slots=True)
class TokenizeConfig:
    """The router's own tokenization (``RouterConfig.tokenize``; flags keep their names)."""

    tokenize_cache_tokens: int = 1 << 20
    """Token ids the router's tokenize cache keeps (router/routing/tokenize_cache.py), about 43 bytes of memory each;
    0 turns the cache off."""
    forward_token_ids: bool = True
    """Forward the prompt token ids the router computed, so replicas do not tokenize again: kvmesh replicas
    get them for completions and chat, vLLM upstreams for completions (router/http/token_forwarding.py)."""
    tokenizers: dict[str, str] = field(default_factory=dict)
    """Several base models behind one router: served model name -> the tokenizer (path or hub id) of that model's
    requests, for base models other than ``model``; one not named here gets the path its replicas report when
    that is a directory on this host (``load_reported_tokenizers``), else the router's own tokenizer."""
    load_reported_tokenizers: bool = True
    """Load another base model's tokenizer from the path its replicas report, when it exists on this host."""

    def __post_init__(self) -> None:
        if self.tokenize_cache_tokens < 0:
            raise ValueError(f"tokenize_cache_tokens must be >= 0, got {self.tokenize_cache_tokens}")


@dataclass(slots=True)
class SyncConfig:
    """The sync stream between the routers of one service (router/control/router_sync.py): each tells the others of
    every request it sends, so inside a burst none decides blind of the others' choices (``RouterConfig.sync``;
    flags ``--sync-bind``, ``--sync-peers``)."""

    bind: str | None = None
    """ZeroMQ endpoint this router publishes its choices on (tcp://127.0.0.1:5600; port 0 picks a free one); None:
    it publishes none. ``kvmesh serve`` sets it for the routers it places on several nodes."""
    peers: tuple[str, ...] = ()
    """The other routers' sync endpoints, each followed: their requests count on the replicas' loads here and their
    prompts' blocks as held where they went, until the replicas' published loads and events say so themselves."""
    choices_per_s: float = 5000.0
    """Choices taken from one peer per second at most, every 64 block keys counting as one more (a flood beyond it
    waits, then is dropped): about what a busy router sends, and half a second of this router's loop at most."""
    choice_burst: int = 1000
    """Choices one peer may send at once above that rate."""
    turn_s: float = 0.0015
    """The routers take turns of this many seconds to decide, each in its own (router/control/turns.py: router k of
    n by their endpoints' order, on the hosts' clocks), so none decides blind of another's choice told it later than
    that; a request waits for its router's next turn, n x this / 2 on average. Longer than the stream's lag; 0: decide
    at once."""

    @property
    def enabled(self) -> bool:
        """This router publishes its choices or follows another's."""
        return self.bind is not None or bool(self.peers)

    def __post_init__(self) -> None:
        for endpoint in (*((self.bind,) if self.bind is not None else ()), *self.peers):
            if not isinstance(endpoint, str) or not endpoint.startswith(("tcp://", "ipc://", "inproc://")):
                raise ValueError(f"router.sync endpoints are ZeroMQ addresses (tcp://HOST:PORT), got {endpoint!r}")
        if not self.choices_per_s > 0 or self.choice_burst < 1:
            raise ValueError("router.sync.choices_per_s must be > 0 and choice_burst >= 1")
        if not 0 <= self.turn_s <= 1:
            raise ValueError(f"router.sync.turn_s must be between 0 and 1 second, got {self.turn_s}")


@dataclass(slots=True)
class RouterConfig:
    """How the router listens, decides and talks to replicas. Sections are handed whole to what uses them
    (``events`` to the subscriber and the stream watch, ``upstream`` to the pool and the proxy, ``outliers`` to
    the outlier detector, ``sessions`` and ``transfers`` to ``KVRouter``); their flags and variables keep flat
    names (cluster/config/schema.py)."""

    host: str = "127.0.0.1"
    """Address to bind (never 0.0.0.0 unless asked); "auto": 127.0.0.1 on one machine, the node's IP in a Ray
    cluster."""
    port: int = 8000
    """HTTP port; 0 picks a free one."""
    model: str | None = None
    """Model path or hub id whose tokenizer the replicas use (needed for cache-aware routing)."""
    tokenizer: str | None = None
    """Tokenizer path if different from ``model``."""
    served_model_name: str | list[str] | None = None
    """Name clients send in "model" (another name gets 404, no "model" is fine); None: serve uses --model as given
    (vLLM's rule; kvmesh-embedded for the embedded model), a standalone router accepts any name."""
    max_model_len: int | None = None
    """Context length for validating requests; None = the model's."""
    policy: str = DEFAULT_POLICY
    """Routing policy: cache_aware_tokens (prefix hits against load in prompt tokens, weights tuned in the simulator),
    cache_aware (the same choice priced in seconds), round_robin, least_loaded, random, prefix_hash
    (router/routing/policies). The other routers' formulas (dynamo, llmd, llmd_precise, sglang) are compared in
    ``kvmesh sim --policies`` only."""
    policy_kwargs: PolicyOptions = field(default_factory=dict)
    """Options of the policy, e.g. temperature=0.05 (seconds) for cache_aware."""
    block_size: int = 16
    """Tokens per KV block; must equal the replicas' block size."""
    api_key: str | None = field(default=None, repr=False, metadata={"env": "KVMESH_API_KEY", "cli": True})
    """Bearer token tenants must send on every path but health/ping/version/metrics (at least 8 characters);
    None disables auth."""
    admin_key: str | None = field(default=None, repr=False, metadata={"env": "KVMESH_ADMIN_KEY"})
    """Bearer token for changing the replica set (POST/DELETE /replicas); None disables those endpoints (403).
    Must differ from api_key: tenants never hold it. ``kvmesh serve`` generates one for its own processes."""
    internal_key: str | None = field(default=None, repr=False, metadata={"env": "KVMESH_INTERNAL_KEY", "cli": True})
    """The cluster's internal key, sent to replicas on every call instead of upstream.replica_api_key: only it opens
    their KV
    plane (kv_transfer_params, /kv/*); must differ from api_key and admin_key. ``kvmesh serve`` generates one."""
    cache_salt_secret: bytes | None = field(default=None, repr=False)
    """SECRET: key of the replicas' cache-salt digests, 32 bytes written as 64 hex characters in a file or variable
    (the cluster record's router_secrets.cache_salt_secret; ``kvcache.hashing.cache_salt_secret(seed)``, not the
    seed); None: requests with a cache_salt are routed without prefix matches."""
    predict_ttl_s: float = 2.0
    """Seconds a routed request's blocks count as cached on its replica before events confirm them."""
    predict_hold_s: float = 0.0
    """0: a routed request's blocks count as cached on its replica for predict_ttl_s from routing. > 0: until the
    replica sends the request's first bytes (its prompt computed) or the request leaves it, and predict_ttl_s after,
    at most this many seconds unreleased: a long prompt still queued or computed is not forgotten half-way. Routers
    that sync hold each other's the same way (router/routing/peer_holds.py)."""
    events: SubscriberConfig = field(default_factory=SubscriberConfig)
    """The KV event feed (events/config.py): CURVE keys, the largest batch, snapshot and cache a replica may
    send, recovery timeouts and back-off, the lag before a replica is routed by load only. Its flags and variables
    keep their flat names (--events-max-payload-bytes, KVMESH_ROUTER_EVENTS_MAX_PAYLOAD_BYTES)."""
    upstream: UpstreamConfig = field(default_factory=UpstreamConfig, metadata={"prefix": ""})
    """Polls of the replicas, deadlines, attempts, stream migration and the replicas' key (--connect-timeout-s,
    --max-attempts, --replica-api-key ...)."""
    outliers: OutlierConfig = field(default_factory=OutlierConfig, metadata={"prefix": "outlier"})
    """Passive health: the failures that eject a replica and for how long (--outlier-consecutive-failures ...)."""
    frontend: FrontendConfig = field(default_factory=FrontendConfig)
    """Body/prompt limits, chat template and its trust, read timeouts (the same settings as a replica's)."""
    access_log: bool = False
    """Log one JSON line per request (logger ``kvmesh.router.access``) with its route receipt: replica,
    reason, predicted / best offered / engine-reported cached tokens."""
    sessions: SessionConfig = field(default_factory=SessionConfig, metadata={"prefix": "session"})
    """Session affinity: how long a session stays pinned to its replica (--session-ttl-s)."""
    tokenize: TokenizeConfig = field(default_factory=TokenizeConfig, metadata={"prefix": ""})
    """The router's tokenize cache and the token ids it forwards (--tokenize-cache-tokens, --forward-token-ids)."""
    workers: int = 1
    """Router processes serving the port (router/control/workers.py): each has its own index, all share their
    in-flight counts; 0 = auto, the cores this host can spare (serve: those not reserved for replicas)."""
    transfers: KVPlacementRules = field(default_factory=KVPlacementRules, metadata={"prefix": ""})
    """KV that moves between replicas: the prefill/decode split and peer pulls (--pd-min-uncached-tokens,
    --peer-pulls ...; router/routing/kv_placement.py)."""
    sync: SyncConfig = field(default_factory=SyncConfig, metadata={"prefix": "sync"})
    """The stream between this router and the others of its service (--sync-bind, --sync-peers): each one's choices
    counted by all as they are made (router/control/router_sync.py)."""
    responses: ResponsesStoreConfig = field(default_factory=ResponsesStoreConfig, metadata={"prefix": "responses"})
    """Where stored responses of the Responses API live: a SQLite file every router process of this host shares,
    or PostgreSQL for routers on several hosts (--responses-path, --responses-dsn)."""
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    """Overload: the router's queue per model by priority and fair share, tenants (a keys file or the request's
    user), token-rate limits, TTFT deadlines, 429 with a reason (router/admission; --admission-keys-file ...)."""

    @property
    def served_name(self) -> str | None:
        """The served name answers report: ``served_model_name``, the first of several (vLLM's rule)."""
        return split_served_names(self.served_model_name, (), "router.served_model_name")[0]

    def served_names(self) -> tuple[str, ...]:
        """Every name ``served_model_name`` gives (``--served-model-name a b``): each is accepted as the model."""
        first, others = split_served_names(self.served_model_name, (), "router.served_model_name")
        return (first, *others) if first is not None else ()

    def __post_init__(self) -> None:
        split_served_names(self.served_model_name, (), "router.served_model_name")  # a bad list raises here
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port={self.port} is not a TCP port; use 0..65535 (0 = ephemeral)")
        self.policy_config()
        if self.block_size <= 0:
            raise ValueError(f"block_size must be positive, got {self.block_size}")
        if self.workers < 0:
            raise ValueError(f"workers must be >= 1, or 0 for auto; got {self.workers}")
        if not 0 <= self.predict_hold_s < math.inf:  # held forever, a request that never answered would leak
            raise ValueError(f"predict_hold_s must be finite seconds >= 0 (0: off), got {self.predict_hold_s}")
        check_api_key(self.api_key, "api_key")
        check_api_key(self.admin_key, "admin_key")
        if self.admin_key is not None and self.admin_key == self.api_key:
            raise ValueError("admin_key equals api_key: every tenant would hold the admin key; use another secret")
        check_internal_key(self.internal_key, "internal_key", {"api_key": self.api_key, "admin_key": self.admin_key})
        check_salt_secret(self.cache_salt_secret)
        if self.sync.enabled and self.internal_key is None:
            raise ValueError("router.sync needs router.internal_key: the routers of one service share it, and derive "
                             "from it the block keys they tell each other of (kvmesh serve generates one)")
        if self.sync.enabled and self.workers != 1:
            raise ValueError(f"router.sync runs in a single router process (workers=1, got {self.workers}): the "
                             "workers of one host already share their counts; sync the hosts' routers instead")

    def policy_config(self) -> PolicyConfig:
        """The policy's typed config section from ``policy_kwargs`` (a bad knob is a ValueError naming it)."""
        return policy_config(self.policy, self.policy_kwargs)


def build_router(config: RouterConfig, seed: int, policy: Policy | None = None) -> KVRouter:
    """The one place a ``KVRouter`` is built from the router's section (``RouterRuntime``, the simulator).

    ``seed``: root of the router keys (the HTTP router draws one at random); ``policy``: one the caller built
    (the simulator seeds one per router, tuned for several policies at once), else ``config.policy`` with
    its ``policy_kwargs``."""
    from kvmesh.router.routing.kv_router import KVRouter
    from kvmesh.router.routing.policies import get_policy

    if policy is None:
        policy = get_policy(config.policy, config.policy_config(), block_size=config.block_size)
    return KVRouter(config.block_size, policy, seed=seed, predict_ttl_s=config.predict_ttl_s,
                    sessions=config.sessions, salt_secret=config.cache_salt_secret, transfers=config.transfers,
                    predict_hold_s=config.predict_hold_s,
                    ttft_target_s=config.admission.target_s())
