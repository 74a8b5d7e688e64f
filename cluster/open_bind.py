"""A server that anyone on the network can call, said loudly: a non-loopback bind with no API key.

``kvmesh serve``, ``kvmesh router`` and ``kvmesh replica`` bind 127.0.0.1 unless told otherwise; told ``--host
0.0.0.0`` (or any address other machines reach) without a key, they still start, as vLLM does, but say so in a
block on stderr that names the fix.
"""

from __future__ import annotations

import ipaddress
import sys

LOOPBACK_NAMES = frozenset({"localhost", "ip6-localhost", "ip6-loopback"})
"""Host names that only this machine reaches (besides the loopback addresses)."""
RULE = "*" * 78


def is_loopback(host: str) -> bool:
    """Whether only this machine can reach ``host`` (127.0.0.0/8, ::1, localhost); a name is taken as reachable."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def open_bind_lines(what: str, host: str, port: int | str, key_flags: str) -> list[str]:
    """The warning: who can call, and how to close it."""
    anyone = "anyone on any network" if host in ("0.0.0.0", "::", "") else "anyone who can reach that address"
    return [RULE,
            f"WARNING: {what} listens on {host}:{port} with no API key: {anyone} can send it requests.",
            f"Set KVMESH_API_KEY (or {key_flags}), or bind --host 127.0.0.1.",
            RULE]


def warn_open_bind(command: str, what: str, host: str, port: int | str, keyed: bool, key_flags: str = "--api-key",
                   ) -> bool:
    """Print the warning for ``kvmesh COMMAND`` when ``host`` is not loopback and no key guards it; whether it did."""
    if keyed or is_loopback(host):
        return False
    for line in open_bind_lines(what, host, port, key_flags):
        print(f"kvmesh {command}: {line}", file=sys.stderr, flush=True)
    return True
