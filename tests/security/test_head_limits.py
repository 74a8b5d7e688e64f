"""A request head is bounded before anything reads it, on the router's own server (router/http/door.py) and on the
replica's (uvicorn, replica/openai/runner.py) alike: past ``max_header_bytes`` or ``max_headers`` a 431, past
``max_request_line_bytes`` a 414, OpenAI-shaped, sent as soon as the limit is passed (the client is still
sending), before any key is checked (both servers here require one; none is sent); heads within the limits are
served, on fresh and keep-alive connections alike."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import pytest
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse, StreamingResponse
from kvmesh.replica.openai.config import FrontendConfig
from kvmesh.replica.openai.runner import HTTPServer
from kvmesh.router.config import RouterConfig
from kvmesh.router.control.router_server import RouterServer

from ..router.conftest import BLOCK_SIZE

FRONTEND = FrontendConfig(max_header_bytes=16 << 10, max_headers=20, max_request_line_bytes=1024,
                          header_timeout_s=5.0)
KEY = "sk-head-limits-0123"


@pytest.fixture(scope="module")
def router():
    server = RouterServer(RouterConfig(port=0, block_size=BLOCK_SIZE, api_key=KEY, frontend=FRONTEND), []).start()
    yield server.port
    server.stop()


@pytest.fixture(scope="module")
def uvicorn_server():
    app = FastAPI()

    @app.get("/ping")
    async def ping():
        return PlainTextResponse("pong")

    @app.get("/slow")
    async def slow():
        async def chunks():
            for i in range(5):
                await asyncio.sleep(0.1)
                yield b"chunk %d;" % i
        return StreamingResponse(chunks())

    server = HTTPServer(app, frontend=FRONTEND)
    server.start_in_thread()
    yield server.port
    server.stop_thread()


@pytest.fixture(params=["router", "replica"])
def port(request):
    return request.getfixturevalue("router" if request.param == "router" else "uvicorn_server")


@pytest.fixture
def path(request):
    """A path the server answers 200 with the key."""
    return b"/v1/models" if request.node.callspec.params["port"] == "router" else b"/ping"


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.settimeout(5)
    return sock


def answer_while_sending(sock: socket.socket, head: bytes, endless: bytes | None = None, limit_s: float = 5.0):
    """Send ``head``, then ``endless`` over and over (a header that never ends) until the server answers or closes;
    the answer's status, its JSON body and the bytes sent."""
    sock.sendall(head)
    sent = len(head)
    sock.setblocking(False)
    deadline = time.monotonic() + limit_s
    data = b""
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
            if b"\r\n\r\n" in data and len(data.split(b"\r\n\r\n", 1)[1]) >= _length(data):
                break
        except BlockingIOError:
            pass
        except ConnectionResetError:
            break
        if endless is not None:
            try:
                sent += sock.send(endless)
            except (BlockingIOError, BrokenPipeError, ConnectionResetError):
                time.sleep(0.001)
        else:
            time.sleep(0.001)
    sock.close()
    assert data, f"no answer after {sent} bytes sent in {limit_s}s"
    status = int(data.split(b" ", 2)[1])
    return status, json.loads(data.split(b"\r\n\r\n", 1)[1]), sent


def _length(data: bytes) -> int:
    for line in data.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 0


def test_a_header_that_never_ends_gets_431_once_past_the_limit(port):
    t0 = time.monotonic()
    status, body, sent = answer_while_sending(
        connect(port), b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Big: ", endless=b"a" * 65536)
    assert status == 431 and "16384 bytes" in body["error"]["message"] and body["error"]["code"] == 431
    assert body["error"]["type"] == "invalid_request_error"
    assert time.monotonic() - t0 < 2.0
    assert sent < 64 << 20  # answered while the header was still coming: the client stopped, not the server


def test_too_many_headers_get_431(port):
    head = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(25)) + b"\r\n"
    status, body, _ = answer_while_sending(connect(port), head)
    assert status == 431 and "more than 20 header lines" in body["error"]["message"]


def test_a_long_request_target_gets_414(port):
    status, body, _ = answer_while_sending(connect(port), b"GET /" + b"a" * 2000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 414 and "1024 bytes" in body["error"]["message"]


def test_an_endless_request_target_gets_414_while_it_is_sent(port):
    status, _, sent = answer_while_sending(connect(port), b"GET /", endless=b"a" * 65536)
    assert status == 414 and sent < 64 << 20


def test_heads_within_the_limits_are_served_on_one_keep_alive_connection(port, path):
    sock = connect(port)
    big = b"X-Fill: " + b"f" * (12 << 10) + b"\r\n"  # 12 KiB of 16: within the limit, several times in a row
    for _ in range(3):
        head = b"GET " + path + b" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() + b"\r\n" + big
        sock.sendall(head + b"".join(b"X-H%d: v\r\n" % i for i in range(15)) + b"\r\n")
        assert read_answer(sock).startswith(b"HTTP/1.1 200")
    sock.close()


def test_pipelined_heads_each_within_the_limit_are_served_though_together_they_pass_it(port, path):
    sock = connect(port)
    head = (b"GET " + path + b" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() + b"\r\nX-Fill: "
            + b"f" * (12 << 10) + b"\r\n\r\n")
    sock.sendall(head * 3)  # 36 KiB in one write: each head 12 KiB of the 16
    data, statuses = b"", []
    while len(statuses) < 3:
        while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < _length(data):
            chunk = sock.recv(65536)
            assert chunk, (statuses, data[:300])
            data += chunk
        statuses.append(int(data.split(b" ", 2)[1]))
        data = data.split(b"\r\n\r\n", 1)[1][_length(data):]
    sock.close()
    assert statuses == [200, 200, 200]


def test_a_limit_passed_on_a_keep_alive_connection_is_refused_there(port, path):
    sock = connect(port)
    sock.sendall(b"GET " + path + b" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() + b"\r\n\r\n")
    assert read_answer(sock).startswith(b"HTTP/1.1 200")
    status, _, _ = answer_while_sending(sock, b"GET " + path + b" HTTP/1.1\r\nX-Big: ", endless=b"b" * 65536)
    assert status == 431


def read_answer(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < _length(data):
        chunk = sock.recv(65536)
        assert chunk, data[:300]
        data += chunk
    return data


@pytest.mark.parametrize("field", ["max_header_bytes", "max_headers", "max_request_line_bytes"])
def test_the_limits_are_checked(field):
    with pytest.raises(ValueError, match=field):
        FrontendConfig(**{field: 0})


def test_a_head_refused_while_an_answer_streams_lets_that_answer_end_then_closes(uvicorn_server):
    sock = connect(uvicorn_server)
    sock.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\nGET /ping HTTP/1.1\r\nX-Big: " + b"b" * (64 << 10))
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    sock.close()
    assert data.startswith(b"HTTP/1.1 200") and b"chunk 4;" in data and data.count(b"HTTP/1.1") == 1, data
