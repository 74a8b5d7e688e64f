"""Who sent a request and at what priority, from its credentials alone (router/admission/tenants.py).

    Authorization: Bearer <key>  ->  Tenants.resolve(key, user)  ->  the tenant (a keys file's, else the shared one)
    x-kvmesh-priority, else the body's ``priority``  ->  Tenant.grant  ->  the priority it is queued and served at

Every request through the proxy gets one, with admission on or off: the granted priority is what the router's queue
orders by and what every leg to a replica that schedules by priority carries (``ProxyRequest.priority``), whatever
the body or a header asked. A priority outside +-PRIORITY_LIMIT is a 400 naming where it came from.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvmesh.replica.openai.auth import authorization
from kvmesh.replica.openai.sampling_fields import PRIORITY_LIMIT
from kvmesh.replica.serving.errors import ProtocolError

if TYPE_CHECKING:
    from kvmesh.replica.openai.protocol import ChatCompletionRequest, CompletionRequest
    from kvmesh.router.admission.tenants import Tenant, Tenants
    from kvmesh.router.http.messages import HttpRequest
    from kvmesh.router.replicas.replica import Replica

PRIORITY_HEADER = b"x-kvmesh-priority"
"""A gateway's priority for the request (an integer, lower first; overrides the body's ``priority``; clamped as it)."""


def bearer_key(http: HttpRequest) -> str | None:
    """The key of ``Authorization: Bearer <key>`` (None: none): the one the auth rule checked (several headers are a
    400, ``authorization``)."""
    auth = authorization(http.raw_headers).decode("latin-1")
    return auth[7:] if auth[:7].lower() == "bearer " else None


def identify(http: HttpRequest, req: CompletionRequest | ChatCompletionRequest, tenants: Tenants) -> tuple[Tenant, int]:
    """The request's tenant and granted priority (module doc); ProtocolError 400 for a bad priority header."""
    tenant = tenants.resolve(bearer_key(http), req.user)
    asked = int_header(http, PRIORITY_HEADER, f"an integer within +-{PRIORITY_LIMIT} (lower is served first)",
                       bound=PRIORITY_LIMIT)
    if asked is None and "priority" in req.model_fields_set:
        asked = req.priority
    return tenant, tenant.grant(asked)


def schedules_by_priority(replica: Replica) -> bool:
    """Whether the replica said it schedules by priority (``/load``'s ``scheduling_policy``): only then does a leg
    to it carry a priority (a vLLM replica under fcfs refuses a non-zero one; one that says nothing gets none)."""
    return replica.load.scheduling_policy == "priority"


def int_header(http: HttpRequest, name: bytes, what: str, positive: bool = False,
               bound: int | None = None) -> int | None:
    """Header ``name`` as an integer (None: absent); a 400 saying it must be ``what`` otherwise."""
    value = http.header(name)
    if value is None:
        return None
    text = value.strip()
    digits = text[1:] if text[:1] in ("+", "-") else text  # ASCII digits after a sign: int() also reads "1_000"
    number = int(text) if len(digits) <= 40 and digits.isascii() and digits.isdigit() else None
    if number is None or (positive and number <= 0) or (bound is not None and abs(number) > bound):
        raise ProtocolError(f"header {name.decode()} must be {what}, got {value[:40]!r}", 400)
    return number
