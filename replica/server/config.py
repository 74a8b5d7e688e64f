"""The replica server's config section: where one replica listens (HTTP, KV events) and what it calls itself."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field, replace

from kvmesh.events.config import PublisherConfig
from kvmesh.replica.openai.config import check_api_key, check_internal_key
from kvmesh.replica.serving.model_names import split_served_names

AUTO_HOST = "auto"
"""``host`` value a Ray actor resolves on its node (actor.py: 127.0.0.1 on one node, else the node's IP)."""


@dataclass(frozen=True, slots=True)
class ReplicaServerConfig:
    """Where a replica serves HTTP and KV events, its keys and served name."""

    host: str = "127.0.0.1"
    """Address for HTTP and events; loopback by default ("auto" in a Ray actor: the node's address)."""
    port: int = 8100
    """HTTP port; 0 picks a free one (the JSON line on stdout says which)."""
    event_port: int | None = 5557
    """KV event PUB port (0 = free port); null (flag: --event-port none) publishes no events."""
    replay_port: int = 5558
    """Replay/snapshot ROUTER port (0 = free port)."""
    events_endpoint: str | None = None
    """Full PUB endpoint instead of host/event_port, e.g. connect://tcp://collector:5557."""
    api_key: str | None = field(default=None, repr=False, metadata={"env": "KVMESH_API_KEY", "cli": True})
    """Bearer token clients must send on /v1/* routes (at least 8 characters); None disables auth."""
    internal_key: str | None = field(default=None, repr=False, metadata={"env": "KVMESH_INTERNAL_KEY", "cli": True})
    """The cluster's internal key (the router's and peer replicas'): passes every path, and alone opens the KV plane
    (kv_transfer_params, /kv/*); needed with kv_transfer on a non-loopback host. ``kvmesh serve`` generates one."""
    router_only: bool = False
    """Tenants reach this replica only through its router (its admission, the priority it grants): every path but
    the public ones takes the internal key alone, the API key gets a 403 saying so. ``kvmesh serve`` sets it; a
    standalone replica keeps the API key's rule. Needs internal_key."""
    served_model_name: str | list[str] | None = None
    """Name clients put in "model"; None -> the model value."""
    served_model_aliases: tuple[str, ...] = ()
    """The other names of ``served_model_name: [a, b]`` (``--served-model-name a b``, vLLM's several names): each is
    accepted as the model, answers report the first (``served_model_name`` holds it once the config is built)."""
    default_max_tokens: int | None = None
    """max_tokens for chat requests that set none; None fills the context (vLLM's behaviour)."""
    num_replicas: int = 1
    """Replicas ``kvmesh replica`` serves from this one process (an emulated fleet, ``--emulate``), replica i on
    ports ``port + i``, ``event_port + 2i`` and ``replay_port + 2i`` (0: free ones), each its own engine, HTTP
    server and event stream."""
    admin_key: str | None = field(default=None, repr=False, metadata={"env": "KVMESH_ADMIN_KEY"})
    """The operator's key for the replica's admin plane (``/v1/load_lora_adapter``, ``/v1/unload_lora_adapter``);
    the internal key opens it too, the API key never. Unset with any key set: only the internal key opens it."""

    def __post_init__(self) -> None:
        served, aliases = split_served_names(self.served_model_name, self.served_model_aliases,
                                             "server.served_model_name")
        object.__setattr__(self, "served_model_name", served)  # frozen: normalized once, here
        object.__setattr__(self, "served_model_aliases", aliases)
        ports = {"port": self.port, "replay_port": self.replay_port, "event_port": self.event_port}
        for name, port in ports.items():
            if port is not None and not 0 <= port <= 65535:
                raise ValueError(f"server.{name}={port} is not a TCP port; use 0..65535 (0 = ephemeral)")
        if not isinstance(self.num_replicas, int) or self.num_replicas < 1:
            raise ValueError(f"server.num_replicas={self.num_replicas!r} must be a positive integer")
        if self.num_replicas > 1 and self.events_endpoint:
            raise ValueError("server.num_replicas > 1 gives each replica its own event port; drop events_endpoint")
        top = max(p or 0 for p in ports.values()) + 2 * (self.num_replicas - 1)
        if top > 65535:
            raise ValueError(f"server.num_replicas={self.num_replicas} counts ports past 65535; lower the ports "
                             "or use 0 (free ones)")
        check_api_key(self.api_key, "server.api_key")
        check_api_key(self.admin_key, "server.admin_key")
        if self.admin_key is not None and self.admin_key == self.api_key:
            raise ValueError("server.admin_key equals server.api_key: every tenant would hold the admin key; "
                             "use another secret")
        check_internal_key(self.internal_key, "server.internal_key",
                           {"server.api_key": self.api_key, "server.admin_key": self.admin_key})
        if self.router_only and self.internal_key is None:
            raise ValueError("server.router_only needs server.internal_key (the router's key to this replica)")
        if self.default_max_tokens is not None and self.default_max_tokens < 1:
            raise ValueError(f"server.default_max_tokens={self.default_max_tokens} must be at least 1 (or unset)")
        try:
            ipaddress.ip_address(self.host)
        except ValueError:
            if not re.fullmatch(r"[A-Za-z0-9.-]+", self.host):
                raise ValueError(f"server.host={self.host!r} is not an address") from None

    @property
    def is_loopback(self) -> bool:
        """Whether it listens on loopback only (no other host can reach it)."""
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return self.host == "localhost"

    def nth(self, i: int) -> ReplicaServerConfig:
        """Replica ``i``'s server of ``num_replicas``: its ports counted up from these (0 stays 0), one replica."""
        def up(port: int | None, step: int) -> int | None:
            return port + step * i if port else port

        return replace(self, num_replicas=1, port=up(self.port, 1), event_port=up(self.event_port, 2),
                       replay_port=up(self.replay_port, 2) or 0)

    def publisher_config(self, events: PublisherConfig) -> PublisherConfig | None:
        """The events section with this server's PUB and replay addresses; None: this replica publishes no events."""
        replay = f"tcp://{self.host}:{self.replay_port}"
        if self.events_endpoint:
            return replace(events, endpoint=self.events_endpoint, replay_endpoint=replay)
        if self.event_port is None:
            return None
        return replace(events, endpoint=f"bind://tcp://{self.host}:{self.event_port}", replay_endpoint=replay)
