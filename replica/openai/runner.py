"""Running a FastAPI app under uvicorn inside an existing asyncio loop, on a thread of its own, or in
the foreground -- the one runner of the router and the replica.

``HTTPServer.start()`` returns once the socket is bound (so port 0 resolves to the real port) and
``stop()`` stops accepting, lets in-flight responses finish for ``graceful_s``, then closes.

Slow clients cannot hold connections: a connection that has not sent a complete request head
within ``header_timeout_s`` (from its opening, or from the first byte of its next request) is
closed (slowloris); bodies have their own deadline (body.py); idle keep-alive connections close
after ``keep_alive_s``. A head past ``max_header_bytes``, ``max_headers`` or ``max_request_line_bytes`` is
answered 431/414 as soon as the limit is passed (head_limits.py), before the app sees the request.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import TYPE_CHECKING

import httptools
from kvmesh.replica.openai.config import FrontendConfig
from kvmesh.replica.openai.head_limits import HeadLimits, linger, refusal
from kvmesh.replica.serving.errors import ProtocolError
from starlette.types import ASGIApp
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

if TYPE_CHECKING:
    import uvicorn

logger = logging.getLogger(__name__)


class HeaderTimeoutProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol plus a deadline and bounds on each request head."""

    frontend = FrontendConfig()  # replaced per server by a subclass (see ``protocol_class``)
    _head_timer: asyncio.TimerHandle | None = None

    @property
    def header_timeout_s(self) -> float:
        return self.frontend.header_timeout_s

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer: asyncio.TimerHandle | None = None
        self.limits = HeadLimits(self.frontend)
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        """uvicorn's, with each head fed no further than its bounds (a 431/414 closes the connection)."""
        self._unset_keepalive_if_required()
        try:
            for piece in self.limits.pieces(data):
                with self.limits:
                    self.parser.feed_data(piece)
        except ProtocolError as e:
            logger.info("refusing a request head: %s", e.message)
            self.parser, self.url, self.headers = httptools.HttpRequestParser(self), b"", []  # drop the head read
            if self.cycle is not None and not self.cycle.response_complete:  # an answer is under way: it ends,
                self.cycle.keep_alive = False  # then the connection closes
                self.transport.pause_reading()
                return
            self.transport.write(refusal(e))
            linger(self.transport)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
        except httptools.HttpParserError:
            self.logger.warning("Invalid HTTP request received.")
            self.send_400_response("Invalid HTTP request received.")

    def on_url(self, url: bytes) -> None:
        self.limits.url(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.limits.header()
        super().on_header(name, value)

    def on_message_complete(self) -> None:
        self.limits.message_done()
        super().on_message_complete()

    def _arm_head_timer(self) -> None:
        self._disarm_head_timer()
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        timer = self._head_timer
        if timer is not None:
            timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            logger.info("closing a connection that sent no complete request head in %.0fs", self.header_timeout_s)
            self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._head_timer is None:
            self._arm_head_timer()

    def on_headers_complete(self) -> None:
        self.limits.head_done()
        self._disarm_head_timer()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)


def protocol_class(frontend: FrontendConfig) -> type[HeaderTimeoutProtocol]:
    return type("HeaderTimeoutProtocol", (HeaderTimeoutProtocol,), {"frontend": frontend})


def uvicorn_config(app: ASGIApp, frontend: FrontendConfig, graceful_s: float, host: str, port: int,
                   lifespan: str = "off", log_level: str = "warning") -> uvicorn.Config:
    """The one uvicorn configuration of kvmesh's HTTP fronts: httptools with the head's timeout and bounds,
    the keep-alive limit and graceful shutdown of ``frontend``, listening on ``host:port``."""
    import uvicorn

    return uvicorn.Config(
        app, host=host, port=port, log_level=log_level, access_log=False, lifespan=lifespan,
        timeout_graceful_shutdown=graceful_s, timeout_keep_alive=frontend.keep_alive_s, limit_concurrency=None,
        backlog=2048, http=protocol_class(frontend))


class HTTPServer:
    """One uvicorn server bound to ``host:port`` (port 0 = ephemeral)."""

    def __init__(self, app: ASGIApp, host: str = "127.0.0.1", port: int = 0, graceful_s: float = 5.0,
                 log_level: str = "warning", frontend: FrontendConfig | None = None, lifespan: str = "off",
                 name: str = "kvmesh-http"):
        import uvicorn

        frontend = frontend or FrontendConfig()
        self.host = host
        self.name = name
        self._config = uvicorn_config(app, frontend, host=host, port=port, log_level=log_level, lifespan=lifespan,
                                      graceful_s=graceful_s)
        self._server = uvicorn.Server(self._config)
        self._task: asyncio.Task | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.port: int = port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self, timeout_s: float = 30.0) -> str:
        """Start serving in the running loop; returns the URL once the socket is bound."""
        self._task = asyncio.ensure_future(self._server.serve())
        deadline = asyncio.get_running_loop().time() + timeout_s
        while not self._server.started:
            if self._task.done():
                self._task.result()  # re-raise why it could not start (port in use, ...)
                raise RuntimeError(f"HTTP server on {self.host}:{self.port} exited before it started")
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"HTTP server on {self.host}:{self.port} did not start in {timeout_s}s")
            await asyncio.sleep(0.01)
        sock = self._server.servers[0].sockets[0]
        self.port = sock.getsockname()[1]
        logger.info("%s listening on %s", self.name, self.url)
        return self.url

    async def stop(self) -> None:
        """Stop accepting, give in-flight requests the graceful period, then close."""
        if self._task is None:
            return
        self._server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self._task), self._config.timeout_graceful_shutdown + 5)
        except (asyncio.TimeoutError, Exception):  # noqa: BLE001 - closing anyway
            self._server.force_exit = True
        self._task = None

    def run(self) -> None:
        """Serve in the foreground until interrupted (the CLI; uvicorn handles SIGINT/SIGTERM)."""
        self._server.run()

    # ------------------------------------------------------------ own thread (tests, sync callers)
    def start_in_thread(self, timeout_s: float = 30.0) -> str:
        """Run the server on a daemon thread with its own loop; returns the URL."""
        started = threading.Event()
        error: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self.start(timeout_s))
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                error.append(e)
                if self._task is not None and self._task.done() and not self._task.cancelled():
                    self._task.exception()  # retrieved: asyncio prints none at exit
                started.set()
                return
            started.set()
            try:
                loop.run_until_complete(self._task)
            finally:
                loop.close()

        self._thread = threading.Thread(target=run, name=self.name, daemon=True)
        self._thread.start()
        if not started.wait(timeout_s + 5) or error:
            if error and isinstance(error[0], SystemExit):  # uvicorn's startup failure, logged above it (a port
                # taken since the config's check, a privileged one): an address error its caller names in one line
                raise OSError(f"the HTTP server could not listen on {self.host}:{self._config.port} (uvicorn's "
                              "error above says why)")
            raise RuntimeError(f"HTTP server did not start: {error[0] if error else 'timeout'}")
        return self.url

    def stop_thread(self, timeout_s: float = 15.0) -> None:
        if self._thread is None:
            return
        self._server.should_exit = True
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            self._server.force_exit = True
            self._thread.join(5)
        self._thread = None
