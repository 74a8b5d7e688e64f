"""The header attacker, run in a process of its own (so its sending does not share the servers' interpreter):

    python tests/security/head_flood.py PORT CONNECTIONS SECONDS HEADER_BYTES

``CONNECTIONS`` threads each open a connection, send a request head whose one header is ``HEADER_BYTES`` long
(streamed, never buffered whole), read what the server answers while sending, and open the next connection ``PAUSE_S``
later, until
``SECONDS`` passed or a SIGTERM
came (the last ones run to their answer). Prints one JSON line: every connection's (status or 0, bytes sent, seconds to
the answer).
"""

from __future__ import annotations

import json
import select
import signal
import socket
import sys
import threading
import time

CHUNK = b"a" * (64 << 10)
LIMIT_S = 10.0
"""Seconds one connection sends and waits for its answer."""
ANSWER_WAIT_S = 0.001
"""Seconds to look for an answer after each piece of the header."""
PAUSE_S = 0.05
"""Seconds between one thread's connections (each sends one huge header: the attack is its size, not a flood of
connections)."""


def one_connection(port: int, header_bytes: int) -> tuple[int, int, float]:
    """Send one endless head, 64 KiB at a time, looking for an answer after each piece; (the answer's status or 0
    when none came within ``LIMIT_S``, bytes sent, seconds to the answer)."""
    t0 = time.monotonic()
    deadline = t0 + LIMIT_S
    sock = socket.create_connection(("127.0.0.1", port), timeout=LIMIT_S)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Big: ")
    sent, data = 0, b""
    try:
        while time.monotonic() < deadline and b"\r\n" not in data:
            if sent < header_bytes:
                try:
                    sock.sendall(CHUNK[:header_bytes - sent])
                    sent += min(len(CHUNK), header_bytes - sent)
                except (BrokenPipeError, ConnectionResetError):
                    sent = header_bytes  # closed by the server: read what it answered
            if select.select([sock], [], [], ANSWER_WAIT_S if sent < header_bytes else LIMIT_S)[0]:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    finally:
        sock.close()
    status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else 0
    return status, sent, time.monotonic() - t0


def main(port: int, connections: int, seconds: float, header_bytes: int) -> None:
    deadline = time.monotonic() + seconds
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    results: list[tuple[int, int, float]] = []

    def attack() -> None:
        while time.monotonic() < deadline and not stop.is_set():
            results.append(one_connection(port, header_bytes))
            time.sleep(PAUSE_S)

    threads = [threading.Thread(target=attack) for _ in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps(results))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]))
