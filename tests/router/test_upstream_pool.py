"""The router's replica client (router/http/upstream.py) against a scripted raw HTTP server: keep-alive
reuse, a pooled connection the server closed, refused connections and a server that stops answering."""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest
from kvmesh.router.http.upstream import UpstreamConnectError, UpstreamError, UpstreamPool

OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"ok\":true}"


class ScriptedServer:
    """Accepts connections; ``behave(conn_index, request_index)`` says what to do with each request:
    "ok" (answer, keep alive), "drop" (close without answering), "hang" (never answer)."""

    def __init__(self, behave) -> None:
        self.behave, self.connections = behave, 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn, self.connections - 1), daemon=True).start()

    def _serve(self, conn: socket.socket, index: int) -> None:
        buf, n = b"", 0
        with conn:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, buf = buf.split(b"\r\n\r\n", 1)
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                while len(buf) < length:
                    buf += conn.recv(65536)
                buf = buf[length:]
                what = self.behave(index, n)
                n += 1
                if what == "drop":
                    return
                if what == "hang":
                    threading.Event().wait(30)
                    return
                conn.sendall(OK)

    def close(self) -> None:
        self.sock.close()


async def _post(pool: UpstreamPool, url: str) -> bytes:
    response = await pool.post(url, "/v1/completions", b"{}", {"content-type": "application/json"})
    assert response.status == 200 and response.headers["content-type"] == "application/json"
    body = await response.read()
    response.release()
    return body


def test_sequential_requests_share_one_keep_alive_connection():
    server = ScriptedServer(lambda conn, req: "ok")

    async def main():
        pool = UpstreamPool(2.0, 5.0)
        assert [await _post(pool, server.url) for _ in range(5)] == [b'{"ok":true}'] * 5
        pool.close()
        return pool.connections_made

    assert asyncio.run(main()) == 1 and server.connections == 1
    server.close()


def test_a_pooled_connection_closed_by_the_server_is_retried_on_a_fresh_one():
    # the first connection answers once, then closes when the next request arrives (an idle timeout race)
    server = ScriptedServer(lambda conn, req: "drop" if conn == 0 and req == 1 else "ok")

    async def main():
        pool = UpstreamPool(2.0, 5.0)
        assert await _post(pool, server.url) == b'{"ok":true}'
        assert await _post(pool, server.url) == b'{"ok":true}'  # sent on the stale one, then on a new one
        pool.close()
        return pool.connections_made

    assert asyncio.run(main()) == 2
    server.close()


def test_a_fresh_connection_closed_before_the_answer_is_an_upstream_error():
    server = ScriptedServer(lambda conn, req: "drop")

    async def main():
        with pytest.raises(UpstreamError) as failed:
            await UpstreamPool(2.0, 5.0).post(server.url, "/x", b"{}", {})
        assert not isinstance(failed.value, UpstreamConnectError)  # the replica was reached

    asyncio.run(main())
    server.close()


def test_a_refused_connection_is_a_connect_error():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # bound, not listening

    async def main():
        with pytest.raises(UpstreamConnectError):
            await UpstreamPool(2.0, 5.0).post(f"http://127.0.0.1:{sock.getsockname()[1]}", "/x", b"{}", {})

    asyncio.run(main())
    sock.close()


def test_a_server_that_stops_answering_hits_the_read_timeout():
    server = ScriptedServer(lambda conn, req: "hang")

    async def main():
        with pytest.raises(UpstreamError, match="sent nothing for 0.3s"):
            await UpstreamPool(2.0, 0.3).post(server.url, "/x", b"{}", {})

    asyncio.run(main())
    server.close()
