"""The router's own HTTP/1.1 server (router/http/door.py) on a real socket: what clients rely on from
an HTTP server, on the proxied paths (served directly) and the others (the FastAPI app behind it)."""

from __future__ import annotations

import json
import socket
import threading

import httpx
import pytest

from .conftest import BLOCK_SIZE
from .test_router_http import prompt


def _connect(router) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", router.port), timeout=10)
    sock.settimeout(10)
    return sock


class _Reader:
    """Reads HTTP/1.1 responses off a socket, one after the other (content-length or chunked bodies)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buf = sock, b""

    def _fill(self) -> bool:
        data = self.sock.recv(65536)
        self.buf += data
        return bool(data)

    def _until(self, marker: bytes) -> bytes:
        while marker not in self.buf:
            assert self._fill(), f"connection closed; had {self.buf[:200]!r}"
        out, self.buf = self.buf.split(marker, 1)
        return out

    def _take(self, n: int) -> bytes:
        while len(self.buf) < n:
            assert self._fill(), "connection closed inside a body"
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def response(self) -> tuple[int, dict[str, str], bytes]:
        lines = self._until(b"\r\n\r\n").decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
        if "content-length" in headers:
            return status, headers, self._take(int(headers["content-length"]))
        body = b""
        if headers.get("transfer-encoding") == "chunked":
            while size := int(self._until(b"\r\n"), 16):
                body += self._take(size)
                self._take(2)
            self._take(2)
        return status, headers, body

    def closed(self) -> bool:
        return not self.buf and not self._fill()


def _post(path: str, body: dict, extra: str = "") -> bytes:
    raw = json.dumps(body).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(raw)}\r\n"
            f"{extra}\r\n").encode() + raw


def test_pipelined_requests_are_answered_in_order_on_one_connection(fakes, start_router):
    router = start_router([fakes[0].spec])
    sock = _connect(router)
    sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
                 + _post("/v1/completions", {"prompt": prompt(1), "max_tokens": 2})
                 + b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
                 + _post("/v1/completions", {"prompt": [1, "x"], "max_tokens": 2}))
    reader = _Reader(sock)
    answers = [reader.response() for _ in range(4)]
    assert [a[0] for a in answers] == [200, 200, 200, 400]
    assert json.loads(answers[0][2])["object"] == "list"
    assert json.loads(answers[1][2])["choices"][0]["text"] == "a"
    assert json.loads(answers[2][2])["status"] == "ok"
    assert json.loads(answers[3][2])["error"]["code"] == 400
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")  # still open: keep-alive
    status, headers, _ = reader.response()
    assert status == 200 and headers["connection"] == "close" and reader.closed()
    sock.close()


def test_a_chunked_request_body_is_read(fakes, start_router):
    router = start_router([fakes[0].spec])
    raw = json.dumps({"prompt": prompt(2), "max_tokens": 2}).encode()
    parts = (raw[:10], raw[10:])
    r = httpx.post(router.url + "/v1/completions", content=iter(parts), headers={"content-type": "application/json"})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "a"
    r = httpx.post(router.url + "/tokenize", content=iter([b'{"prompt": ', b'"once upon a time"}']))
    assert r.status_code == 200 and r.json()["tokens"]


@pytest.mark.parametrize("path", ["/v1/completions", "/tokenize"])
def test_expect_100_continue_is_answered_before_the_body_is_sent(fakes, start_router, path):
    router = start_router([fakes[0].spec])
    sock = _connect(router)
    request = _post(path, {"prompt": "once upon a time", "max_tokens": 2}, "Expect: 100-continue\r\n")
    head, body = request.split(b"\r\n\r\n", 1)
    sock.sendall(head + b"\r\n\r\n")
    reader = _Reader(sock)
    assert reader.response()[0] == 100  # nothing of the body was sent yet
    sock.sendall(body)
    status, _, answer = reader.response()
    assert status == 200, answer
    sock.close()


@pytest.mark.parametrize("request_bytes", [
    b"GARBAGE\r\n\r\n",
    b"GET /health HTTP/1.1\r\nHost: x\r\nBad Header Line\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 9\r\n\r\nhello",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
])
def test_malformed_http_gets_a_400_and_the_connection_closes(fakes, start_router, request_bytes):
    router = start_router([fakes[0].spec])
    sock = _connect(router)
    sock.sendall(request_bytes)
    reader = _Reader(sock)
    status, _, body = reader.response()
    assert status == 400 and json.loads(body)["error"]["code"] == 400
    assert reader.closed()
    sock.close()
    assert httpx.get(router.url + "/health").status_code == 200  # the server goes on


def test_an_oversized_chunked_body_on_an_app_path_is_refused_while_it_streams_in(fakes, start_router, tokenizer):
    router = start_router([fakes[0].spec], frontend=_frontend(max_body_bytes=64 << 10))

    def chunks():
        yield b'{"prompt": "'
        for _ in range(100):
            yield b"x" * 8192

    r = httpx.post(router.url + "/tokenize", content=chunks(), timeout=10)
    assert r.status_code == 413 and r.json()["error"]["code"] == 413


def _frontend(**kw):
    from kvmesh.replica.openai.config import FrontendConfig

    return FrontendConfig(**kw)


def test_api_key_is_required_on_proxied_and_app_paths_but_not_on_probes(fakes, start_router):
    router = start_router([fakes[0].spec], api_key="sk-test-key-1234567890")
    body = {"prompt": prompt(4), "max_tokens": 2}
    for method, path, payload in (("POST", "/v1/completions", body), ("POST", "/v1/chat/completions",
                                  {"messages": [{"role": "user", "content": "hi"}]}), ("GET", "/v1/models", None)):
        r = httpx.request(method, router.url + path, json=payload)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error", path
    key = {"Authorization": "Bearer sk-test-key-1234567890"}
    assert httpx.get(router.url + "/replicas", headers=key).status_code == 403  # the replicas' URLs: admin only
    assert httpx.post(router.url + "/v1/completions", json=body, headers=key).status_code == 200
    assert httpx.get(router.url + "/health").status_code == 200
    r = httpx.post(router.url + "/replicas", json={"url": "http://127.0.0.1:1"}, headers=key)
    assert r.status_code == 403  # the API key never changes the replica set


def test_sequential_requests_reuse_one_upstream_connection(fakes, start_router):
    router = start_router([fakes[0].spec])
    with httpx.Client(base_url=router.url) as client:
        for i in range(10):  # streams (read up to their [DONE]) and whole answers alternate
            r = client.post("/v1/completions", json={"prompt": prompt(10 + i), "max_tokens": 2, "stream": i % 2 == 0})
            assert r.status_code == 200 and '"text":"a"' in r.text.replace(" ", "")
    assert router.runtime.pool.connections_made == 1


def test_a_refused_replica_is_skipped_and_the_request_goes_to_another(fakes, tokenizer):
    from kvmesh.router.config import ReplicaSpec, RouterConfig, UpstreamConfig
    from kvmesh.router.control.router_server import RouterServer

    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    spec = ReplicaSpec(f"http://127.0.0.1:{dead.getsockname()[1]}", replica_id="dead")
    cfg = RouterConfig(port=0, block_size=BLOCK_SIZE,
                       upstream=UpstreamConfig(poll_interval_s=60))  # no probe puts it back meanwhile
    router = RouterServer(cfg, [fakes[0].spec, spec], tokenizer=tokenizer).start()
    runtime = router.runtime
    retried = lambda: runtime.metrics.registry.get_sample_value("kvmesh_router_retries_total",  # noqa: E731
                                                                {"replica": "dead"}) or 0
    for i in range(30):
        runtime.router.set_healthy(runtime.router.replicas.get("dead"),
                                   True)  # as if the replica died after its last probe
        r = httpx.post(router.url + "/v1/completions", json={"prompt": prompt(100 + i), "max_tokens": 2})
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == "a"
        if retried():
            break
    assert retried() >= 1
    assert "dead" not in runtime.router.healthy
    router.stop()
    dead.close()


def test_stop_lets_an_in_flight_request_finish(fakes, tokenizer):
    from kvmesh.router.config import RouterConfig
    from kvmesh.router.control.router_server import RouterServer

    a = fakes[0]
    router = RouterServer(RouterConfig(port=0, block_size=BLOCK_SIZE), [a.spec], tokenizer=tokenizer).start()
    a.configure(delay=1.5)  # still running when stop() is seen to begin, however loaded; within its 2 s
    out = {}

    def send():
        out["r"] = httpx.post(router.url + "/v1/completions", json={"prompt": prompt(5), "max_tokens": 2},
                              timeout=10)

    t = threading.Thread(target=send)
    t.start()
    from .conftest import wait_for

    wait_for(lambda: router.runtime.router.loads.loads["a"].in_flight == 1, what="the request sent to the replica")
    router.stop()  # graceful: 2 s for in-flight requests
    t.join(10)
    assert out["r"].status_code == 200 and out["r"].headers["connection"] == "close"
    with pytest.raises(httpx.ConnectError):
        httpx.get(router.url + "/health")


def test_an_unhandled_error_answers_500_naming_a_request_id_not_the_exception(fakes, start_router, caplog):
    # A bug (or a library failing in an unplanned way) must not hand its internals to the client: the 500
    # names a request id, under which the router logged the exception with its traceback.
    router = start_router([fakes[0].spec])

    def broken(*args, **kwargs):
        raise RuntimeError("unable to perform operation on <TCPTransport closed=True 0x55ff2c687c80>")

    router.runtime.router.route = broken
    with caplog.at_level("ERROR", logger="kvmesh.router.http.door"):
        r = httpx.post(router.url + "/v1/completions", json={"prompt": prompt(7), "max_tokens": 2}, timeout=10)
    assert r.status_code == 500
    error = r.json()["error"]
    assert error["type"] == "internal_server_error" and error["code"] == 500
    assert "RuntimeError" not in r.text and "TCPTransport" not in r.text, r.text
    request_id = error["message"].split("request id ")[1].split(")")[0]
    logged = [rec for rec in caplog.records if request_id in rec.getMessage()]
    assert logged and "TCPTransport" in logged[0].getMessage() and logged[0].exc_info is not None
