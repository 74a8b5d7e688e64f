"""The peers a replica may pull from: each router's replica set (``POST /kv/peers``) and ``--kv-peer`` URLs.

A ``remote_url`` in ``kv_transfer_params`` is the address a puller calls with the cluster's key: it is called
only when it is a registered peer's (compared normalized: scheme, host, port and path, a trailing slash aside;
``http://Host:80/`` is ``http://host``), otherwise the pull is skipped without any HTTP call and the prompt
computed. Registrations are per router: a router names itself (``router_id``) and the registered peers are the
union of every router's set. A router's registration replaces only its own last one, and expires ``ttl_s`` after
it unless that router registers again (routers renew theirs every ``upstream.kv_peers_renew_s``, and whenever
their set changes or a replica turns healthy), so two routers in front of the same replicas never undo each
other, and a router that stopped leaves nothing behind. A registration without ``router_id`` (an older router,
a hand-made call) is one anonymous router's; without ``ttl_s`` it does not expire. The ``--kv-peer`` URLs stay
registered whatever is pushed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from kvmesh.replica.serving.errors import echo

if TYPE_CHECKING:
    from fastapi import Request

DEFAULT_PORTS = {"http": 80, "https": 443}
MAX_ROUTERS = 64
"""Routers whose registrations one replica keeps at once (each lapses when its router stops renewing it)."""
REPLICA_ID_HEADER = "x-kvmesh-replica-id"
"""Who calls a holder's /kv/*: pullers send their replica id (the holder's lease caps count per peer)."""


def peer_of(http: Request) -> str:
    """Whom a /kv/* call (or a prefill call) counts against: its x-kvmesh-replica-id, else its address."""
    named = http.headers.get(REPLICA_ID_HEADER)
    if named:
        return f"replica:{named[:256]}"
    return f"address:{http.client.host if http.client is not None else 'unknown'}"


def normalize_url(url: str) -> str | None:
    """``scheme://host:port/path`` (lower-case scheme and host, the scheme's port spelled out, no trailing
    slash); None for what is no plain http(s) base URL (user info, a query or a fragment, no host)."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:  # a port that is no number
        return None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname or parts.username is not None or parts.password is not None \
            or parts.query or parts.fragment:
        return None
    host = parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"  # IPv6
    return f"{scheme}://{host}:{port or DEFAULT_PORTS[scheme]}{parts.path.rstrip('/')}"


@dataclass(slots=True)
class Registration:
    """One router's set."""

    peers: dict[str, str]
    """Normalized URL -> replica id, as that router last pushed them."""
    expires_at: float | None
    """When it lapses unless renewed (the registry's clock); None: never."""


class PeerRegistry:
    """Registered peers by normalized URL, per router (see the module doc)."""

    def __init__(self, static_urls: tuple[str, ...] = (), max_routers: int = MAX_ROUTERS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._static = {u for u in map(normalize_url, static_urls) if u is not None}
        self._routers: dict[str, Registration] = {}
        """Router id ("" for one without) -> its registration."""
        self.max_routers = max_routers
        """Routers whose sets may be registered at once (a bound on what registrations may hold)."""
        self.clock = clock

    def replace(self, peers: list[tuple[str, str]], router_id: str = "", ttl_s: float | None = None) -> int:
        """Router ``router_id``'s set, ``(replica_id, url)`` each, replacing its own last one and lapsing ``ttl_s``
        from now (None: never); how many peers are registered in all. ``ValueError`` naming a URL that is no
        http(s) base URL, or past ``max_routers`` (nothing replaced then)."""
        pushed = {}
        for replica_id, url in peers:
            normal = normalize_url(url)
            if normal is None:
                raise ValueError(f"peer {echo(repr(replica_id))} has url {echo(repr(url))}; give its "
                                 "http(s)://host:port")
            pushed[normal] = replica_id
        now = self.clock()
        self._expire(now)
        if router_id not in self._routers and len(self._routers) >= self.max_routers:
            raise ValueError(f"{len(self._routers)} routers have registered peers here, the most this replica "
                             "keeps; a router's registration lapses when it stops renewing it")
        self._routers[router_id] = Registration(pushed, None if ttl_s is None else now + ttl_s)
        return self.num_registered

    def _expire(self, now: float) -> None:
        for router_id in [r for r, reg in self._routers.items()
                          if reg.expires_at is not None and reg.expires_at <= now]:
            del self._routers[router_id]

    def urls(self) -> set[str]:
        """Every router's registered URLs (the ``--kv-peer`` URLs aside), lapsed ones left out."""
        self._expire(self.clock())
        return {url for reg in self._routers.values() for url in reg.peers}

    @property
    def num_registered(self) -> int:
        """Peers registered by the routers, each counted once (the ``--kv-peer`` URLs aside)."""
        return len(self.urls())

    @property
    def num_routers(self) -> int:
        """Routers whose registrations are current."""
        self._expire(self.clock())
        return len(self._routers)

    def resolve(self, url: str) -> str | None:
        """The normalized URL to call when ``url`` is a registered peer's; None when it is not."""
        normal = normalize_url(url)
        if normal is None:
            return None
        return normal if normal in self._static or normal in self.urls() else None
