"""Client connection timeouts across keep-alive requests: each request re-arms them (router/http/deadline.py)."""

from __future__ import annotations

import socket
import time

import pytest
from kvmesh.replica.openai.config import FrontendConfig
from kvmesh.router.config import RouterConfig
from kvmesh.router.control.router_server import RouterServer

GET = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.fixture(scope="module")
def router():
    frontend = FrontendConfig(header_timeout_s=0.5, keep_alive_s=2.0)
    server = RouterServer(RouterConfig(port=0, frontend=frontend), []).start()
    yield server
    server.stop()


def _connect(router) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", router.port), timeout=5)
    sock.settimeout(5)  # a recv that times out fails the test: the server should have answered or closed
    return sock


def _answer(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
        chunk = sock.recv(65536)
        assert chunk, f"closed before the answer ended: {data!r}"
        data += chunk
    return data


def test_requests_closer_than_the_keep_alive_keep_the_connection_then_idle_closes_it(router):
    sock = _connect(router)
    for _ in range(3):  # 3 s in all, longer than keep_alive_s: each answer re-arms it
        sock.sendall(GET)
        assert _answer(sock).startswith(b"HTTP/1.1 503")
        time.sleep(1.0)  # the pacing under test: idle gaps shorter than keep_alive_s, longer in sum
    assert sock.recv(65536) == b""  # then idle: closed by the server


def test_a_stalled_head_after_an_answer_is_cut_off_by_the_header_timeout(router):
    sock = _connect(router)
    sock.sendall(GET)
    assert _answer(sock).startswith(b"HTTP/1.1 503")
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    assert sock.recv(65536) == b""  # closed by the server: the head timeout, armed at its first byte
