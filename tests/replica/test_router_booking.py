"""A request's booking on its router's load (replica/openai/router_booking.py): honoured only from the cluster's
internal key, a malformed one refused by name (a client sending it to the router:
tests/router/test_published_load.py)."""

from __future__ import annotations

import pytest
from kvmesh.replica.openai.auth import INTERNAL_SCOPE_KEY
from kvmesh.replica.openai.router_booking import ROUTER_HEADER, booking_header, router_booking
from kvmesh.replica.serving.errors import ProtocolError
from starlette.requests import Request

INTERNAL_KEY = "internal-0123456789"


def _http(headers: dict[str, str], internal: bool) -> Request:
    raw = [(k.lower().encode(), v.encode("latin-1")) for k, v in headers.items()]
    return Request({"type": "http", "method": "POST", "path": "/v1/completions", "headers": raw,
                    "state": {INTERNAL_SCOPE_KEY: internal}})


def test_the_routers_booking_is_read_from_the_cluster():
    assert router_booking(_http(booking_header("77-ab12", 9, 480), internal=True), INTERNAL_KEY) == ("77-ab12", 9, 480)
    assert router_booking(_http({}, internal=False), INTERNAL_KEY) is None


def test_a_caller_without_the_internal_key_may_not_book_on_a_routers_load():
    with pytest.raises(ProtocolError) as refused:
        router_booking(_http(booking_header("77-ab12", 9, 0), internal=False), INTERNAL_KEY)
    assert refused.value.status_code == 403 and refused.value.param == ROUTER_HEADER


def test_a_malformed_booking_is_a_400_naming_the_header():
    with pytest.raises(ProtocolError) as refused:
        router_booking(_http({ROUTER_HEADER: "router;drop:1:2"}, internal=True), INTERNAL_KEY)
    assert refused.value.status_code == 400 and refused.value.param == ROUTER_HEADER
