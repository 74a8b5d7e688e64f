"""Private event streams: ZeroMQ CURVE (encryption + authentication) on the PUB and replay sockets.

Token ids in ``BlockStored`` are every tenant's prompts, and one snapshot returns the whole cache,
so in cluster mode the stream is private::

    publisher (replica)  CURVE server: its secret key; optionally an allow-list of client keys
                         (checked by a ZAP handler on the publisher's own zmq context)
    subscriber (router)  CURVE client: the publishers' public key + a keypair of its own

A peer without the server's public key (or, with an allow-list, without an allowed keypair)
completes no handshake and receives nothing. Plain mode stays for vLLM-style consumers, which
know no CURVE; it is announced loudly when a socket listens beyond loopback. Keys are Z85 text
(40 characters), as ``zmq.curve_keypair()`` makes them.
"""

from __future__ import annotations

import ipaddress
import logging
import re

import zmq

logger = logging.getLogger(__name__)

_Z85_KEY = re.compile(r"^[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}$")
_HOST = re.compile(r"^tcp://(?:\[(?P<v6>[^\]]*)\]|(?P<host>[^:/]*)):")


def require_curve() -> None:
    """Raise a clear error when this libzmq was built without CURVE."""
    if not zmq.has("curve"):
        raise RuntimeError("this libzmq has no CURVE support (zmq.has('curve') is False); install a pyzmq "
                           "wheel (bundles libsodium) or drop the curve keys for a plain stream")


def generate_keypair() -> tuple[str, str]:
    """A fresh ``(public, secret)`` CURVE keypair as Z85 text."""
    require_curve()
    public, secret = zmq.curve_keypair()
    return public.decode(), secret.decode()


def public_key(secret_key: str) -> str:
    """The public key that belongs to ``secret_key``."""
    return zmq.curve_public(check_key(secret_key, "secret").encode()).decode()


def check_key(key: str, what: str) -> str:
    """``key`` if it is a Z85 CURVE key; a ValueError naming ``what`` otherwise (never the key)."""
    if not isinstance(key, str) or not _Z85_KEY.match(key):
        raise ValueError(f"CURVE {what} key must be 40 characters of Z85 text (zmq.curve_keypair()); "
                         f"got {len(key) if isinstance(key, str) else type(key).__name__} characters")
    return key


def make_server(sock: zmq.Socket, secret_key: str) -> None:
    """Make ``sock`` a CURVE server (before bind/connect)."""
    require_curve()
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.CURVE_SECRETKEY, check_key(secret_key, "secret").encode())


def make_client(sock: zmq.Socket, server_key: str, public: str, secret: str) -> None:
    """Make ``sock`` a CURVE client of the server whose public key is ``server_key``."""
    require_curve()
    sock.setsockopt(zmq.CURVE_SERVERKEY, check_key(server_key, "server public").encode())
    sock.setsockopt(zmq.CURVE_PUBLICKEY, check_key(public, "client public").encode())
    sock.setsockopt(zmq.CURVE_SECRETKEY, check_key(secret, "client secret").encode())


class _AllowList:
    def __init__(self, keys: tuple[str, ...]) -> None:
        self.keys = {k.encode() for k in keys}

    def callback(self, domain: str, key: bytes) -> bool:
        return key in self.keys


def start_authenticator(ctx: zmq.Context, client_keys: tuple[str, ...]):
    """A ZAP handler on ``ctx`` that admits only ``client_keys``; call ``.stop()`` when done."""
    from zmq.auth.thread import ThreadAuthenticator

    for key in client_keys:
        check_key(key, "client public")
    auth = ThreadAuthenticator(ctx)
    auth.start()
    auth.configure_curve_callback("*", credentials_provider=_AllowList(tuple(client_keys)))
    return auth


def is_loopback(address: str) -> bool:
    """True for ipc/inproc and tcp on 127.0.0.0/8, ::1 or localhost."""
    if address.startswith(("ipc://", "inproc://")):
        return True
    m = _HOST.match(address)
    if not m:
        return False
    host = m.group("v6") if m.group("v6") is not None else m.group("host")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a wildcard (*) or a host name: reachable from elsewhere


def warn_if_plain_beyond_loopback(address: str, what: str) -> bool:
    """Log a warning (and return True) when a plain-text socket listens beyond loopback."""
    if is_loopback(address):
        return False
    logger.warning("KV event %s %s is PLAIN TEXT beyond loopback: anyone who reaches it reads every tenant's "
                   "token ids (BlockStored) and, on the replay socket, the whole cache. Set CURVE keys "
                   "(PublisherConfig.curve_secret_key) unless only vLLM-style consumers on a trusted network "
                   "read it.", what, address)
    return True
