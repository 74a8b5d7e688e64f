"""Running a FastAPI app under uvicorn inside an existing asyncio loop, or on a thread of its own.

``HTTPServer.start()`` returns once the socket is bound (so port 0 resolves to the real port) and
``stop()`` stops accepting, lets in-flight responses finish for ``graceful_s``, then closes.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

logger = logging.getLogger(__name__)


class HTTPServer:
    """One uvicorn server bound to ``host:port`` (port 0 = ephemeral)."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, graceful_s: float = 5.0,
                 log_level: str = "warning"):
        import uvicorn

        self.host = host
        self._config = uvicorn.Config(
            app, host=host, port=port, log_level=log_level, access_log=False, lifespan="off",
            timeout_graceful_shutdown=graceful_s, timeout_keep_alive=30, limit_concurrency=None,
            backlog=2048,
        )
        self._server = uvicorn.Server(self._config)
        self._server.install_signal_handlers = lambda: None  # the owner (CLI, actor) handles signals
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
        logger.info("replica HTTP server listening on %s", self.url)
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
                started.set()
                return
            started.set()
            try:
                loop.run_until_complete(self._task)
            finally:
                loop.close()

        self._thread = threading.Thread(target=run, name="replica-http", daemon=True)
        self._thread.start()
        if not started.wait(timeout_s + 5) or error:
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
