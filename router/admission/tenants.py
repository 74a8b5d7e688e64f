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

Without a keys file (or for the router's own ``--api-key``), the tenant is the request's ``user`` field
(vLLM's and OpenAI's end-user id), else ``DEFAULT_TENANT``. Keys are looked up by digest, so the lookup's
time says nothing about a key's bytes.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import msgspec
from kvmesh.router.admission.rate_limit import TokenRate

DEFAULT_TENANT = "default"
"""The tenant of a request with neither a tenant's key nor a ``user``."""
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
    priority: int | None = None
    """Its requests' default priority (None: 0, a ``user`` tenant)."""
    limit: TokenRate | None = None
    """Its token-rate limit (None: none)."""
    min_priority: int | None = None
    """The best (lowest) priority its requests may ask for; None: any (a ``user`` tenant)."""


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("latin-1", "replace")).digest()


class Tenants:
    """API key or ``user`` -> ``Tenant``."""

    def __init__(self, entries: list[KeyEntry] = (), default_limit: TokenRate | None = None,
                 burst_s: float = 10.0) -> None:
        self.default_limit = default_limit
        """The limit of tenants the keys file gives none (every ``user`` tenant)."""
        self._by_key: dict[bytes, Tenant] = {}
        for n, entry in enumerate(entries):
            where = f"keys file entry {n + 1} (tenant {entry.tenant!r})"
            if len(entry.key) < MIN_KEY_CHARS:
                raise ValueError(f"{where}: key is shorter than {MIN_KEY_CHARS} characters")
            if not entry.tenant:
                raise ValueError(f"keys file entry {n + 1}: tenant is empty; name the tenant")
            digest = _digest(entry.key)
            if digest in self._by_key:
                raise ValueError(f"{where}: the same key is listed twice")
            limit = default_limit
            if entry.tokens_per_s is not None:
                limit = TokenRate(entry.tokens_per_s, entry.burst_tokens or entry.tokens_per_s * burst_s)
            elif entry.burst_tokens is not None:
                raise ValueError(f"{where}: burst_tokens without tokens_per_s")
            floor = entry.priority if entry.min_priority is None else entry.min_priority
            if floor > entry.priority:
                raise ValueError(f"{where}: min_priority {floor} is worse than its default priority {entry.priority}")
            self._by_key[digest] = Tenant(entry.tenant, entry.priority, limit, floor)

    @property
    def has_keys(self) -> bool:
        return bool(self._by_key)

    def holds_header(self, header: bytes) -> bool:
        """Whether an ``Authorization`` header value (``Bearer <key>``) carries one of the file's keys."""
        if not self._by_key or header[:7].lower() != b"bearer ":
            return False
        return _digest(header[7:].decode("latin-1")) in self._by_key

    def for_key(self, key: str | None) -> Tenant | None:
        """The tenant of API key ``key`` (None: not a tenant's key)."""
        return None if key is None or not self._by_key else self._by_key.get(_digest(key))

    def resolve(self, key: str | None, user: str | None) -> Tenant:
        """The request's tenant: its key's, else its ``user``, else ``DEFAULT_TENANT``."""
        tenant = self.for_key(key)
        if tenant is not None:
            return tenant
        return Tenant(user or DEFAULT_TENANT, None, self.default_limit, None)


def load_keys_file(path: str | Path, default_limit: TokenRate | None = None, burst_s: float = 10.0) -> Tenants:
    """Read a keys file (YAML or JSON, see the module doc); a ValueError naming what is wrong."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ValueError(f"cannot read the admission keys file {path}: {e.strerror}") from None
    try:
        parsed = msgspec.yaml.decode(data, type=KeysFile)
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        raise ValueError(f"admission keys file {path}: {e}; expected 'keys:' a list of "
                         "{key, tenant, priority, tokens_per_s, burst_tokens}") from None
    return Tenants(parsed.keys, default_limit, burst_s)
