"""An HTTP listener on 127.0.0.1 that records every call made to it (method, path, Authorization header).

The URL a tenant would name as ``remote_url``: a replica that calls it has been made to call a stranger, and the
recorded Authorization header is the credential it carried.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    authorization: str | None


@dataclass
class Listener:
    calls: list[Call] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> Listener:
        calls, lock = self.calls, threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def _record(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                if length:
                    self.rfile.read(length)
                with lock:
                    calls.append(Call(self.command, self.path, self.headers.get("authorization")))
                body = b'{"error": {"message": "not here", "type": "NotFoundError", "code": 404}}'
                self.send_response(404)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_DELETE = _record

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
