"""Fields of a request body only the router sets: a client that sends one gets a 400 naming it.

    kv_transfer_params   both paths   the P/D split's handle or a peer to pull from (kv_handoff.py): it names a
                                      URL the replica calls carrying the cluster's key, and blocks it leases
    prompt_token_ids     chat         the messages as the router tokenized them (token_forwarding.py): a kvmesh
                                      replica takes them instead of rendering the messages

    x-kvmesh-tenant      a header     the tenant the router's key check found, for the replica's grammar compile
                                      turns (replica/openai/compile_tenant.py): a client naming its own would pick
                                      whose turns its compiles take
    x-kvmesh-router      a header     the router's booking of the request on the replica's published load
                                      (replica/openai/router_booking.py): a forged one would hide load from a router

The test is on the DECODED body, the same decode the replica makes (msgspec, then the pydantic model:
escapes resolved, the last duplicate key wins), never on its bytes: ``"kv_transfer\\u005fparams"`` is the
same key. Any presence is refused, ``null`` included, to be simple. A key nested in another object is
not the field and reaches no replica as one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvmesh.replica.openai.compile_tenant import TENANT_HEADER
from kvmesh.replica.openai.router_booking import ROUTER_HEADER
from kvmesh.replica.serving.errors import ProtocolError

if TYPE_CHECKING:
    from kvmesh.replica.openai.sampling_fields import SamplingFields
    from kvmesh.router.http.messages import HttpRequest

ROUTER_ONLY = {
    "kv_transfer_params": "the router sets it (prefill/decode split, peer pulls) and the KV plane is the cluster's "
                          "own; remove it from the request",
    "prompt_token_ids": "the router sets it (it tokenizes the messages once for the replica); send the messages "
                        "alone, or a /v1/completions request with a token-id prompt",
}
"""Field -> why a client may not send it."""


def refuse_router_only(req: SamplingFields) -> None:
    """A 400 naming a router-only field the decoded request ``req`` has (its model's fields set), the first in
    ``ROUTER_ONLY``'s order."""
    for name, why in ROUTER_ONLY.items():
        if name in req.model_fields_set:
            raise ProtocolError(f"{name} may not be sent to the router: {why}", param=name)


ROUTER_ONLY_HEADERS = {
    TENANT_HEADER: "the router sets it (the tenant your API key names, whose turn a grammar compile takes); remove "
                   "it from the request",
    ROUTER_HEADER: "the router sets it (its booking of the request on the replica's published load); remove it from "
                   "the request",
}
"""Header -> why a client may not send it."""


def refuse_router_only_headers(http: HttpRequest) -> None:
    """A 400 naming a router-only header the request has."""
    for name, why in ROUTER_ONLY_HEADERS.items():
        if http.header(name.encode()) is not None:
            raise ProtocolError(f"header {name} may not be sent to the router: {why}", param=name)
