"""Stored responses: per tenant, bounded in bytes and in age, in a database that outlives the router.

A stored response keeps its Response object, its whole conversation (the chat messages a continuation renders
before its own input: earlier turns and this one's input and output) and its request's input items (what
``GET /v1/responses/{id}/input_items`` lists: input_items.py), so continuing it is one read and evicting
one response never breaks another's conversation. A row belongs to the tenant that stored it: reading, continuing
or deleting it with another tenant's credentials finds nothing (the caller answers 404, as for an id never stored).

Bounds (``FrontendConfig``'s ``responses_*`` fields), applied on every store:
- a response unused (not stored, read or continued) for ``responses_max_age_s`` is gone;
- a tenant's responses hold at most ``responses_max_bytes_per_tenant``: storing one more evicts that tenant's least
  recently used ones first; one larger than the bound alone is not stored (the answer says ``"store": false``);
- all tenants together hold at most ``responses_max_bytes``: the least recently used of any tenant go first.

A response that aged out or was evicted leaves a note (``Expired``, kept as long as a response would be, at most
``responses_max_expired_per_tenant`` per tenant), so its owner is told it expired rather than that it never was;
another tenant still finds nothing.

``ResponseStore`` is the interface; the bounds are written once in portable SQL (sql_store.py) over SQLite
(sqlite_store.py: in memory, or a file every router process of a host shares) and PostgreSQL (postgres_store.py:
routers on several hosts). ``open_store`` (open_store.py) picks one from the router's ``responses`` section
(store_config.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from kvmesh.replica.serving.json_types import JSONObject
from pydantic import JsonValue

UNUSED, TENANT_BYTES, TOTAL_BYTES = "unused", "tenant_bytes", "total_bytes"
"""Why a response went (``Expired.reason``): unused for the max age; its tenant's bytes bound; all tenants' bound."""


@dataclass(frozen=True, slots=True)
class StoredResponse:
    response: JSONObject
    """The Response object as it was answered."""
    conversation: list[JsonValue]
    """The chat messages up to and including this response's output."""
    input_items: list[JsonValue]
    """The request's input as OpenAI's items, each with its id (input_items.py)."""


@dataclass(frozen=True, slots=True)
class Expired:
    """One of the tenant's responses that is gone for a bound (not deleted by its owner)."""

    reason: str
    """``UNUSED``, ``TENANT_BYTES`` or ``TOTAL_BYTES``."""
    at: float
    """When it went (the store's clock, Unix seconds)."""


class StoreUnavailable(OSError):
    """The database did not answer (a file that cannot be opened, PostgreSQL down, no free connection in time)."""


class ResponseStore(ABC):
    """Stored responses (module doc). Every call may raise ``StoreUnavailable``."""

    @abstractmethod
    def get(self, tenant: str, response_id: str) -> StoredResponse | Expired | None:
        """``tenant``'s response ``response_id`` (it counts as used); ``Expired`` if it went for a bound; None: none
        of this tenant's."""

    @abstractmethod
    def put(self, tenant: str, response: JSONObject, conversation: list[JsonValue],
            input_items: list[JsonValue] | None = None) -> bool:
        """Store ``response`` for ``tenant`` within the bounds, with its request's ``input_items``; False: larger
        than a bound alone."""

    @abstractmethod
    def delete(self, tenant: str, response_id: str) -> bool | Expired:
        """Delete ``tenant``'s response ``response_id``: True; ``Expired`` if it had gone already (its note is
        dropped too); False: none of this tenant's."""

    @abstractmethod
    def tenant_bytes(self, tenant: str) -> int:
        """Bytes ``tenant``'s stored responses hold."""

    @abstractmethod
    def total_bytes(self) -> int:
        """Bytes all tenants' stored responses hold."""

    @abstractmethod
    def close(self) -> None:
        """Release the database (its connections)."""
