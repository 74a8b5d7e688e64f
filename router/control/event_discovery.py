"""A replica given by its URL alone: the KV event endpoints it advertises in ``/server_info``.

kvmesh replicas (and servers that say the same) name their event stream and replay socket in ``/server_info``
(``events_endpoint``, ``replay_endpoint``). A replica registered without ``events=`` is re-registered with them when
it first answers (``ReplicaProbes.check_events``), so ``kvmesh router --replica http://HOST:PORT`` routes by what
each replica holds, not by load alone. An endpoint bound to a loopback or wildcard address (a replica started with
its defaults) is reached at the host of the replica's URL. What cannot be an endpoint (another scheme, no port) is
ignored with a warning; a replica that advertises none is routed without its events, which the router says in its
log and in ``/replicas`` (``events_source: none``).
"""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import replace
from urllib.parse import urlsplit

from kvmesh.router.replicas.spec import ReplicaSpec

logger = logging.getLogger(__name__)

LOOPBACK_NAMES = frozenset({"localhost", "ip6-localhost"})
"""Host names of the loopback interface besides 127.0.0.0/8 and ::1."""
WILDCARDS = frozenset({"*", "0.0.0.0", "::", ""})
"""What a ZeroMQ endpoint binds every interface with."""


def advertised_spec(spec: ReplicaSpec, info: dict[str, object] | None) -> ReplicaSpec | None:
    """``spec`` with the event endpoints its replica advertises (module doc); None: it advertises none usable."""
    if not isinstance(info, dict):
        return None
    events = reachable(info.get("events_endpoint"), spec)
    if events is None:
        return None
    return replace(spec, events=events, replay=reachable(info.get("replay_endpoint"), spec))


def reachable(endpoint: object, spec: ReplicaSpec) -> str | None:
    """``endpoint`` (``tcp://HOST:PORT``) as this router reaches ``spec``'s replica: a loopback or wildcard host
    becomes the host of its URL; None for no endpoint, or one that is not a TCP address (warned)."""
    url_host = urlsplit(spec.url).hostname or ""
    if endpoint is None:
        return None
    parts = urlsplit(endpoint) if isinstance(endpoint, str) else None
    try:
        port = parts.port if parts is not None else None
    except ValueError:
        port = None
    if parts is None or parts.scheme != "tcp" or not port:
        logger.warning("replica %s advertises the event endpoint %r, which is not tcp://HOST:PORT; ignored",
                       spec.replica_id, endpoint if isinstance(endpoint, str) else type(endpoint).__name__)
        return None
    host = parts.netloc.rsplit(":", 1)[0].strip("[]")
    if host in WILDCARDS or _is_loopback(host):
        host = url_host
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def _is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
