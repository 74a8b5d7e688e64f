"""The peers a replica may pull from: the router's replica set (``POST /kv/peers``) and ``--kv-peer`` URLs.

A ``remote_url`` in ``kv_transfer_params`` is the address a puller calls with the cluster's key: it is called
only when it is a registered peer's (compared normalized: scheme, host, port and path, a trailing slash aside;
``http://Host:80/`` is ``http://host``), otherwise the pull is skipped without any HTTP call and the prompt
computed. The router replaces its set whenever it changes and whenever a replica turns healthy (a restarted
replica gets it again); the ``--kv-peer`` URLs stay registered whatever it pushes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from fastapi import Request

DEFAULT_PORTS = {"http": 80, "https": 443}
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


class PeerRegistry:
    """Registered peers by normalized URL (see the module doc)."""

    def __init__(self, static_urls: tuple[str, ...] = ()) -> None:
        self._static = {u for u in map(normalize_url, static_urls) if u is not None}
        self._pushed: dict[str, str] = {}
        """Normalized URL -> replica id, as the router last pushed them."""

    def replace(self, peers: list[tuple[str, str]]) -> int:
        """The router's set, ``(replica_id, url)`` each, replacing the last one; how many are registered.
        ``ValueError`` naming a URL that is no http(s) base URL (nothing replaced then)."""
        pushed = {}
        for replica_id, url in peers:
            normal = normalize_url(url)
            if normal is None:
                raise ValueError(f"peer {replica_id!r} has url {url!r}; give its http(s)://host:port")
            pushed[normal] = replica_id
        self._pushed = pushed
        return len(pushed)

    @property
    def num_registered(self) -> int:
        """Peers in the router's last set (the ``--kv-peer`` URLs aside)."""
        return len(self._pushed)

    def resolve(self, url: str) -> str | None:
        """The normalized URL to call when ``url`` is a registered peer's; None when it is not."""
        normal = normalize_url(url)
        return normal if normal is not None and (normal in self._pushed or normal in self._static) else None
