"""Which router booked a request, for the load a replica publishes (events/load.py): the router says; a client
cannot.

    router    every request it sends to a replica that publishes its load carries
              ``x-kvmesh-router: <router id>:<booking number>:<uncached prompt tokens>`` (router/replicas/bookings.py);
              a client that sends the header itself gets a 400 naming it (router/http/router_only.py)
    replica   counts the request as accepted from that router (its published ``accepted``) and its prefill as
              the uncached tokens until it computes its prompt. A caller without the internal key that sends it
              gets a 403, as for ``x-kvmesh-tenant`` (compile_tenant.py): a forged booking would hide load from a
              router.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from kvmesh.replica.openai.router_header import router_header
from kvmesh.replica.serving.errors import ProtocolError

if TYPE_CHECKING:
    from starlette.requests import Request

__all__ = ["MAX_ROUTER_ID_CHARS", "ROUTER_HEADER", "Booking", "booking_header", "parse_booking", "router_booking"]

ROUTER_HEADER = "x-kvmesh-router"
"""The router's header naming itself, its booking number and the uncached prompt tokens it expects."""
MAX_ROUTER_ID_CHARS = 64
"""A longer router id is refused (ids are short: a process and a random part)."""
Booking = tuple[str, int, int]
"""(router id, booking number, uncached prompt tokens)."""
_VALUE = re.compile(rf"([A-Za-z0-9._-]{{1,{MAX_ROUTER_ID_CHARS}}}):([0-9]{{1,18}}):([0-9]{{1,18}})")


def booking_header(router_id: str, number: int, uncached_tokens: int) -> dict[str, str]:
    """The header a router sends with booking ``number`` of ``router_id``, for a prompt of which it expects the
    replica to compute ``uncached_tokens``."""
    return {ROUTER_HEADER: f"{router_id}:{number}:{max(0, uncached_tokens)}"}


def parse_booking(value: str) -> Booking:
    """The booking a ``ROUTER_HEADER`` value names; ValueError saying what is wrong."""
    match = _VALUE.fullmatch(value)
    if match is None:
        raise ValueError(f"header {ROUTER_HEADER} must be '<router id: 1 to {MAX_ROUTER_ID_CHARS} of A-Z a-z 0-9 . _ "
                         f"->:<booking number>:<uncached prompt tokens>', got {value[:80]!r}")
    return match.group(1), int(match.group(2)), int(match.group(3))


def router_booking(http: Request, internal_key: str | None) -> Booking | None:
    """The booking the router named for this request (None: no header); a 403 when a caller other than the
    cluster sends it to a replica that has an internal key, a 400 when it is malformed."""
    value = router_header(http, ROUTER_HEADER, internal_key, "books the request on the router's load")
    if value is None:
        return None
    try:
        return parse_booking(value)
    except ValueError as e:
        raise ProtocolError(str(e), param=ROUTER_HEADER) from None
