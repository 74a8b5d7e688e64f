"""The router's integer headers (``x-kvmesh-priority``, ``x-kvmesh-ttft-deadline-ms``) are ASCII digits with an
optional sign: what Python's ``int`` also reads (``1_000``, surrounding spaces inside the value) is a 400."""

from __future__ import annotations

import pytest
from kvmesh.replica.serving.errors import ProtocolError
from kvmesh.router.http.caller import int_header
from kvmesh.router.http.messages import HttpRequest

NAME = b"x-kvmesh-priority"


def _request(value: bytes) -> HttpRequest:
    http = HttpRequest(b"POST", b"/v1/completions")
    http.raw_headers.append((NAME, value))
    return http


@pytest.mark.parametrize("value, number", [(b"7", 7), (b"-3", -3), (b"+12", 12), (b" 40 ", 40), (b"007", 7)])
def test_digits_with_a_sign_are_read(value, number):
    assert int_header(_request(value), NAME, "an integer") == number


@pytest.mark.parametrize("value", [b"1_000", b"1 000", b"5.0", b"0x10", b"", b"-", b"\xd9\xa5", b"\xb2", b"1e3"])
def test_anything_else_is_a_400_naming_the_header(value):
    with pytest.raises(ProtocolError) as e:
        int_header(_request(value), NAME, "an integer")
    assert e.value.status_code == 400 and "header x-kvmesh-priority must be an integer" in e.value.message


def test_no_header_is_none():
    assert int_header(HttpRequest(b"POST", b"/v1/completions"), NAME, "an integer") is None
