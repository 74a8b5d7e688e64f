"""The shared front end's limits, on a router (the replica runs the same runner, body reader and renderer):
slow clients are cut off, oversized bodies refused before they are read, request templates need trust,
and slow rendering is refused without stalling the server."""

from __future__ import annotations

import socket
import time

import httpx
import pytest
from kvmesh.replica.openai.config import FrontendConfig
from kvmesh.router.config import RouterConfig
from kvmesh.router.control.router_server import RouterServer

from .conftest import BLOCK_SIZE

SLOW_TEMPLATE = ("{% for a in range(20000) %}{% for b in range(1000) %}{% endfor %}{% endfor %}"
                 "{% for m in messages %}{{ m['content'] }}{% endfor %}")
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def strict_router(tokenizer):
    frontend = FrontendConfig(header_timeout_s=0.5, body_timeout_s=1.0, max_body_bytes=64 << 10,
                              trust_request_chat_template=True, render_timeout_s=0.3)
    server = RouterServer(RouterConfig(port=0, block_size=BLOCK_SIZE, frontend=frontend), [],
                          tokenizer=tokenizer).start()
    yield server
    server.stop()


def _connect(router) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", router.port), timeout=5)
    sock.settimeout(5)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_slowloris_connections_are_closed_after_the_header_timeout(strict_router):
    socks = [_connect(strict_router) for _ in range(20)]
    for i, sock in enumerate(socks):
        if i % 2:  # half send part of a request head, half send nothing at all
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    t0 = time.monotonic()
    for sock in socks:
        assert _read_all(sock) == b""  # closed by the server (recv returns EOF, no timeout)
        sock.close()
    assert time.monotonic() - t0 < 5  # the bound of the socket timeout; 0.5 s expected
    assert httpx.get(strict_router.url + "/version").status_code == 200  # and it still serves


def test_a_body_that_stops_arriving_gets_408(strict_router):
    sock = _connect(strict_router)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 100\r\n\r\n{\"prompt\": ")
    head = _read_all(sock).split(b"\r\n", 1)[0]
    sock.close()
    assert head.startswith(b"HTTP/1.1 408")


def test_an_oversized_content_length_is_refused_before_the_body_is_sent(strict_router):
    sock = _connect(strict_router)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 209715200\r\n\r\n")  # 200 MB announced, nothing sent
    response = _read_all(sock)  # the answer, then the server closes
    sock.close()
    assert response.startswith(b"HTTP/1.1 413") and b"209715200" in response


def test_a_chunked_body_is_cut_off_when_it_passes_the_limit(strict_router):
    def chunks():
        yield b'{"prompt": "'
        for _ in range(100):  # 100 x 8 KiB > 64 KiB, never announced
            yield b"x" * 8192

    r = httpx.post(strict_router.url + "/v1/completions", content=chunks(),
                   headers={"content-type": "application/json"}, timeout=10)
    assert r.status_code == 413 and r.json()["error"]["code"] == 413


def test_a_trusted_request_template_is_used(strict_router):
    body = {"messages": HI, "chat_template": "{% for m in messages %}[{{ m['content'] }}]{% endfor %}"}
    r = httpx.post(strict_router.url + "/tokenize", json=body, timeout=10)
    assert r.status_code == 200
    tok = strict_router.runtime.tokenizer
    assert r.json()["tokens"] == tok.encode("[hi]", add_special_tokens=False)


def test_rendering_slower_than_the_limit_is_refused_while_the_server_keeps_serving(strict_router):
    body = {"messages": HI, "chat_template": SLOW_TEMPLATE, "max_tokens": 1}
    r = httpx.post(strict_router.url + "/v1/chat/completions/render", json=body, timeout=30)
    assert r.status_code == 400 and "longer than 0.3s" in r.json()["error"]["message"]
    assert httpx.get(strict_router.url + "/version", timeout=30).status_code == 200
