"""Tenants: whose share and limits a request counts against.

With a keys file (``router.admission.keys_file``), the API key names the tenant: several keys, each with
its tenant's name, default priority and token-rate limit (several keys may name one tenant)::

    keys:                           # YAML or JSON
      - key: sk-team-a-0123456789   # a bearer token (>= 8 characters), unique in the file
        tenant: team-a
        priority: 0                 # the default priority of its requests (lower = sooner)
        min_priority: -10           # the best a request may ask for (header or body); absent: the default
        tokens_per_s: 2000          # prompt + output tokens per second (absent: the section's default)
        burst_tokens: 20000         # the bucket (absent: tokens_per_s x burst_s)

The router's own ``--api-key`` (and, on a router without one, no key at all) is one tenant of its own,
``shared_tenant`` (default ``default``), with its own default priority and ``min_priority`` (AdmissionConfig).
A request's ``user`` never names a tenant: with ``user_tenants`` on it names a sub-tenant of its key's,
``<tenant>/<user>`` (the key's priorities, its own fair share; its tokens come out of the key's bucket), at most
``max_users_per_key`` of them per key; the rest share ``<tenant>/other``. Every caller's priority is clamped
(``Tenant.grant``). Keys are looked up by digest, so the lookup's time says nothing about a key's bytes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import msgspec
from kvmesh.router.admission.rate_limit import TokenRate

DEFAULT_TENANT = "default"
"""The shared tenant's name unless configured: requests with the router's own key, or none."""
OTHER_USERS = "other"
"""The sub-tenant every ``user`` past a key's ``max_users_per_key`` shares (``<tenant>/other``)."""
MAX_USER_CHARS = 64
"""A longer ``user`` goes to ``OTHER_USERS`` (a tenant's name is a metric label)."""
PRIORITY_LIMIT = 2**31 - 1
"""A priority is in [-PRIORITY_LIMIT, PRIORITY_LIMIT]: the OpenAI layer's bound (replica/openai/protocol.py)."""
MIN_KEY_CHARS = 8


class KeyEntry(msgspec.Struct, forbid_unknown_fields=True):
    """One API key of the keys file."""

    key: str
    tenant: str
    priority: int = 0
    min_priority: int | None = None
    tokens_per_s: float | None = None
    burst_tokens: float | None = None


class KeysFile(msgspec.Struct, forbid_unknown_fields=True):
    """The keys file: ``keys:`` a list of ``KeyEntry``."""

    keys: list[KeyEntry]


@dataclass(slots=True, frozen=True)
class Tenant:
    """A tenant as admission sees it."""

    name: str
    """Its name (metrics, fair share, limits)."""
    priority: int = 0
    """Its requests' default priority."""
    limit: TokenRate | None = None
    """Its token-rate limit (None: none)."""
    min_priority: int = 0
    """The best (lowest) priority its requests may ask for (header or body)."""
    parent: str | None = None
    """The key's tenant of a ``user`` sub-tenant, whose bucket its ``limit`` draws from (a key's limit bounds the whole
    key, whatever ``user`` says); None: the tenant draws from its own."""

    @property
    def bucket(self) -> str:
        """The tenant whose token bucket its requests take from: its parent's, else its own."""
        return self.parent or self.name

    def grant(self, asked: int | None) -> int:
        """The priority its request gets: what it asked (None: its default), never better than ``min_priority``."""
        return self.priority if asked is None else max(asked, self.min_priority)


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("latin-1", "replace")).digest()


class Tenants:
    """API key (and, with sub-tenants on, ``user``) -> ``Tenant`` (module doc)."""

    def __init__(self, entries: Iterable[KeyEntry] = (), default_limit: TokenRate | None = None,
                 burst_s: float = 10.0, shared: Tenant | None = None, users_per_key: int = 0) -> None:
        self.default_limit = default_limit
        """The limit of tenants the keys file gives none (the shared tenant's too)."""
        self.shared = shared or Tenant(DEFAULT_TENANT, 0, default_limit, 0)
        """The tenant of the router's own key, or of no key."""
        self.users_per_key = users_per_key
        """Sub-tenants one key's tenant may have (0: ``user`` names none)."""
        self._users: dict[str, dict[str, Tenant]] = {}
        """A key's tenant's name -> its sub-tenants so far, by ``user``."""
        self._by_key: dict[bytes, Tenant] = {}
        for n, entry in enumerate(entries):
            digest = _digest(entry.key)
            if digest in self._by_key:
                raise ValueError(f"keys file entry {n + 1} (tenant {entry.tenant!r}): the same key is listed twice")
            self._by_key[digest] = self._entry_tenant(n, entry, burst_s)

    def _entry_tenant(self, n: int, entry: KeyEntry, burst_s: float) -> Tenant:
        where = f"keys file entry {n + 1} (tenant {entry.tenant!r})"
        if len(entry.key) < MIN_KEY_CHARS:
            raise ValueError(f"{where}: key is shorter than {MIN_KEY_CHARS} characters")
        if not entry.tenant:
            raise ValueError(f"keys file entry {n + 1}: tenant is empty; name the tenant")
        if "/" in entry.tenant:
            raise ValueError(f"{where}: a tenant's name may not contain '/' (it separates a key's sub-tenants)")
        if entry.tenant == self.shared.name:
            raise ValueError(f"{where}: that is the shared tenant's name (the router's own API key's); "
                             "name the key's tenant otherwise, or set admission.shared_tenant")
        floor = entry.priority if entry.min_priority is None else entry.min_priority
        for name, value in (("priority", entry.priority), ("min_priority", floor)):
            if abs(value) > PRIORITY_LIMIT:
                raise ValueError(f"{where}: {name} {value} is outside [-{PRIORITY_LIMIT}, {PRIORITY_LIMIT}]")
        if floor > entry.priority:
            raise ValueError(f"{where}: min_priority {floor} is worse than its default priority {entry.priority}")
        limit = self.default_limit
        if entry.tokens_per_s is not None:
            limit = TokenRate(entry.tokens_per_s, entry.burst_tokens or entry.tokens_per_s * burst_s)
        elif entry.burst_tokens is not None:
            raise ValueError(f"{where}: burst_tokens without tokens_per_s")
        return Tenant(entry.tenant, entry.priority, limit, floor)

    @property
    def has_keys(self) -> bool:
        return bool(self._by_key)

    def limits(self) -> dict[str, TokenRate]:
        """Each keyed and the shared tenant's limit, by name (those with none left out)."""
        named = [*self._by_key.values(), self.shared]
        return {t.name: t.limit for t in named if t.limit is not None}

    def holds_header(self, header: bytes) -> bool:
        """Whether an ``Authorization`` header value (``Bearer <key>``) carries one of the file's keys."""
        if not self._by_key or header[:7].lower() != b"bearer ":
            return False
        return _digest(header[7:].decode("latin-1")) in self._by_key

    def for_key(self, key: str | None) -> Tenant | None:
        """The tenant of API key ``key`` (None: not a tenant's key)."""
        return None if key is None or not self._by_key else self._by_key.get(_digest(key))

    def resolve(self, key: str | None, user: str | None) -> Tenant:
        """The request's tenant: its key's (else the shared one), or with sub-tenants on its ``user``'s under it."""
        tenant = self.for_key(key) or self.shared
        if user is None or not self.users_per_key:
            return tenant
        users = self._users.setdefault(tenant.name, {})
        if user not in users:
            if len(users) >= self.users_per_key or len(user) > MAX_USER_CHARS or user == OTHER_USERS:
                user = OTHER_USERS
            if user not in users:
                users[user] = Tenant(f"{tenant.name}/{user}", tenant.priority, tenant.limit, tenant.min_priority,
                                     parent=tenant.name)
        return users[user]


def load_keys_file(path: str | Path, default_limit: TokenRate | None = None, burst_s: float = 10.0,
                   shared: Tenant | None = None, users_per_key: int = 0) -> Tenants:
    """Read a keys file (YAML or JSON, see the module doc); a ValueError naming what is wrong."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ValueError(f"cannot read the admission keys file {path}: {e.strerror}") from None
    try:
        parsed = msgspec.yaml.decode(data, type=KeysFile)
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        raise ValueError(f"admission keys file {path}: {e}; expected 'keys:' a list of "
                         "{key, tenant, priority, min_priority, tokens_per_s, burst_tokens}") from None
    return Tenants(parsed.keys, default_limit, burst_s, shared, users_per_key)
