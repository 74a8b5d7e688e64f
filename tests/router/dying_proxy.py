"""A TCP proxy in front of a replica that "dies" mid-stream: once the responses through it have carried
``after_events`` SSE events, it passes on what came before the last one, resets every connection and stops listening
(connections are refused
from then on), as a killed replica process does. Proxies sharing one ``Fuse`` die at most once in all,
so whichever replica a test's stream lands on first is the one that dies. With ``stall=True`` the fuse's
connection stalls instead: what came before the event passes on, then nothing more, the connection left
open (a replica that hangs mid-stream); the proxy's other connections go on."""

from __future__ import annotations

import re
import socket
import struct
import threading


class Fuse:
    """Shared by proxies: the first to reach its event count dies; the others stay up."""

    def __init__(self, after_events: int, stall: bool = False) -> None:
        self.after_events = after_events
        self.stall = stall
        self.events = 0
        self.blown_by: str | None = None
        self.lock = threading.Lock()

    def count(self, name: str, data: bytes) -> int | None:
        """Count the events in ``data`` passing through ``name``; when ``name`` must die, the number of
        bytes of ``data`` to pass on first (everything before the event that blows the fuse)."""
        with self.lock:
            if self.blown_by is not None:
                return None
            starts = [m.start() for m in re.finditer(rb"data: ", data)]
            if self.events + len(starts) < self.after_events:
                self.events += len(starts)
                return None
            self.blown_by = name
            cut = starts[self.after_events - self.events - 1]
            self.events = self.after_events
            return cut


class DyingProxy:
    def __init__(self, name: str, target_port: int, fuse: Fuse) -> None:
        self.name, self.target_port, self.fuse = name, target_port, fuse
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.conns: list[socket.socket] = []
        self.dead = False
        self.closed = threading.Event()
        """Set by ``close``: a stalled connection lets go."""
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            with self.lock:
                self.conns += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, response: bool) -> None:
        try:
            while data := src.recv(65536):
                cut = self.fuse.count(self.name, data) if response else None
                if cut is not None:
                    dst.sendall(data[:cut])
                    if self.fuse.stall:
                        self.closed.wait()  # hung: nothing more until the test ends
                    else:
                        self.die()
                    return
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            src.close()

    def die(self) -> None:
        """Reset every connection (RST, as when a process is killed) and refuse new ones."""
        self.dead = True
        try:
            self.listener.close()
        except OSError:
            pass
        with self.lock:
            for s in self.conns:
                try:  # linger 0: reset, not a clean close; shutdown wakes the threads blocked in recv
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.closed.set()
        self.die()
