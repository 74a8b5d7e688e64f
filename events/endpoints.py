"""Endpoint strings: which side binds, which connects, and what address was actually bound.

vLLM's rule for a PUB endpoint: a wildcard host (``tcp://*:5557``, ``tcp://[::]:5557``) or an
``ipc://`` / ``inproc://`` address binds; any other address connects (so many publishers can
push to one subscriber that binds). kvmesh adds two explicit prefixes that override the rule:

- ``bind://tcp://127.0.0.1:5557`` binds that exact interface -- kvmesh's default: in local mode
  the stream listens on loopback only, never on all interfaces;
- ``connect://tcp://collector:5557`` connects, whatever the address looks like.

A tcp port of 0 asks the OS for an ephemeral port, which only a bind can have, so port 0 binds;
``bound_endpoint`` reports the resolved address (``tcp://127.0.0.1:41237``).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

import zmq

BIND_PREFIX = "bind://"
CONNECT_PREFIX = "connect://"
BIND_RETRY_S = 1.0
"""How long a bind retries while the address is still held by a socket just closed."""
_TCP = re.compile(r"^tcp://(?P<host>\[[^\]]*\]|[^:/]*):(?P<port>\*|\d+)$")


@dataclass(frozen=True)
class Endpoint:
    """A ZeroMQ address and whether our socket binds or connects to it."""

    address: str
    """The address handed to zmq, e.g. ``tcp://127.0.0.1:5557`` (no bind:// / connect:// prefix)."""
    bind: bool
    """True: our socket binds (listens) on ``address``; False: it connects to it."""

    def __post_init__(self) -> None:
        if "://" not in self.address:
            raise ValueError(
                f"endpoint {self.address!r} has no transport; write e.g. tcp://127.0.0.1:5557"
            )


def _is_wildcard(address: str) -> bool:
    return "*" in address or "::" in address


def _port_is_zero(address: str) -> bool:
    m = _TCP.match(address)
    return bool(m) and m.group("port") == "0"


def parse_pub_endpoint(endpoint: str) -> Endpoint:
    """vLLM's PUB rule plus kvmesh's explicit prefixes and port 0 (see the module doc)."""
    if endpoint.startswith(BIND_PREFIX):
        return Endpoint(endpoint[len(BIND_PREFIX) :], True)
    if endpoint.startswith(CONNECT_PREFIX):
        return Endpoint(endpoint[len(CONNECT_PREFIX) :], False)
    binds = (
        _is_wildcard(endpoint)
        or endpoint.startswith(("ipc://", "inproc://"))
        or _port_is_zero(endpoint)
    )
    return Endpoint(endpoint, binds)


def parse_listen_endpoint(endpoint: str) -> Endpoint:
    """A socket that always binds (the replay/snapshot ROUTER, as in vLLM)."""
    for prefix in (BIND_PREFIX, CONNECT_PREFIX):
        if endpoint.startswith(prefix):
            if prefix == CONNECT_PREFIX:
                raise ValueError(f"{endpoint!r}: the replay socket always binds; drop 'connect://'")
            endpoint = endpoint[len(prefix) :]
    return Endpoint(endpoint, True)


def parse_sub_endpoint(endpoint: str) -> Endpoint:
    """A subscriber connects to a publisher, or binds (``bind://`` or a wildcard host) and lets
    publishers connect to it."""
    if endpoint.startswith(BIND_PREFIX):
        return Endpoint(endpoint[len(BIND_PREFIX) :], True)
    if endpoint.startswith(CONNECT_PREFIX):
        return Endpoint(endpoint[len(CONNECT_PREFIX) :], False)
    return Endpoint(endpoint, _is_wildcard(endpoint) or _port_is_zero(endpoint))


def offset_port(endpoint: str, offset: int) -> str:
    """vLLM's data-parallel rule: rank r uses port + r (port 0 stays ephemeral)."""
    if offset == 0:
        return endpoint
    prefix = ""
    for p in (BIND_PREFIX, CONNECT_PREFIX):
        if endpoint.startswith(p):
            prefix, endpoint = p, endpoint[len(p) :]
    m = _TCP.match(endpoint)
    if not m or m.group("port") in ("*", "0"):
        return prefix + endpoint
    return f"{prefix}tcp://{m.group('host')}:{int(m.group('port')) + offset}"


def attach(sock: zmq.Socket, endpoint: Endpoint) -> str:
    """Bind or connect ``sock``; return the actual address (ports resolved for binds)."""
    if "[" in endpoint.address or endpoint.address.startswith("tcp://::"):
        sock.setsockopt(zmq.IPV6, 1)
    if not endpoint.bind:
        sock.connect(endpoint.address)
        return endpoint.address
    m = _TCP.match(endpoint.address)
    address = f"tcp://{m.group('host')}:*" if m and m.group("port") == "0" else endpoint.address
    # A socket closed a moment ago (a publisher restarting on its old port) releases the port
    # asynchronously: retry briefly before calling the address taken.
    deadline = time.monotonic() + BIND_RETRY_S
    while True:
        try:
            sock.bind(address)
            break
        except zmq.ZMQError as e:
            if e.errno != zmq.EADDRINUSE or time.monotonic() >= deadline:
                raise zmq.ZMQError(e.errno, f"cannot bind {endpoint.address}: {e.strerror}; "
                                            "pick another port, or port 0 for an ephemeral one") from None
            time.sleep(0.02)
    return bound_endpoint(sock, endpoint.address)


def bound_endpoint(sock: zmq.Socket, requested: str) -> str:
    """The address a bound socket listens on; the wildcard host is kept as requested."""
    last = sock.getsockopt(zmq.LAST_ENDPOINT)
    actual = last.decode() if isinstance(last, bytes) else str(last)
    if not actual:
        return requested
    return actual
