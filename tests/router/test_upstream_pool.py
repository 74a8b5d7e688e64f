"""The router's replica client (router/http/upstream.py) against a scripted raw HTTP server: keep-alive
reuse, a pooled connection the server closed, refused connections and a server that stops answering."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

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


def test_a_pooled_connection_closed_while_idle_is_not_taken():
    # The replica closed an idle keep-alive connection: under uvloop the transport is closing at once and
    # the pool hears of it (connection_lost) a turn of the loop later. A request in between goes on a fresh
    # connection rather than writing into the closing one.
    uvloop = pytest.importorskip("uvloop")
    server = ScriptedServer(lambda conn, req: "ok")

    async def main():
        pool = UpstreamPool(2.0, 5.0)
        assert await _post(pool, server.url) == b'{"ok":true}'
        (idle,) = [conn for conns in pool._idle.values() for conn in conns]
        idle.transport.close()  # as on the replica's FIN, one turn before connection_lost
        assert await _post(pool, server.url) == b'{"ok":true}'
        pool.close()
        return pool.connections_made

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert runner.run(main()) == 2
    server.close()


class _SlowToWrite(UpstreamPool):
    """Resumes after connecting only once the replica's reset was read (a loaded router's loop is late)."""

    async def _connect(self, key):
        conn = await super()._connect(key)
        await asyncio.sleep(0.3)
        return conn


def test_a_connection_reset_before_the_request_was_written_is_a_connect_error():
    # A replica killed under load: its kernel completed the handshake, then reset the connection before the
    # router wrote the request. uvloop raises on that write ("RuntimeError: unable to perform operation on
    # <TCPTransport closed=True ...>"), which reached clients as an HTTP 500 with that text. Nothing was sent,
    # so it is a connect error: the forwarder tries another replica.
    uvloop = pytest.importorskip("uvloop")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(4)

    def reset_each():
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            time.sleep(0.05)  # after the router's connect completed
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            conn.close()  # linger 0: a reset

    threading.Thread(target=reset_each, daemon=True).start()

    async def main():
        with pytest.raises(UpstreamConnectError, match="closed before the request was sent"):
            await _SlowToWrite(2.0, 5.0).post(f"http://127.0.0.1:{sock.getsockname()[1]}", "/x", b"{}", {})

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())
    sock.close()


def test_every_idle_connection_beside_a_stale_one_is_dropped():
    # A replica that restarted closed all its connections: the request goes on a fresh connection at once,
    # not through each dead pooled one in turn.
    server = ScriptedServer(lambda conn, req: "drop" if conn < 3 and req == 1 else "ok")

    async def main():
        pool = UpstreamPool(2.0, 5.0)
        first = await asyncio.gather(*(pool.post(server.url, "/x", b"{}", {}) for _ in range(3)))
        for response in first:
            await response.read()
            response.release()
        assert pool.connections_made == 3
        assert await _post(pool, server.url) == b'{"ok":true}'
        pool.close()
        return pool.connections_made

    assert asyncio.run(main()) == 4
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
