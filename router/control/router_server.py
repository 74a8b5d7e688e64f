"""The assembled router: the runtime (replica set, routing, event intake), its app and the one door.

``RouterServer`` wires the door (router/http/door.py) to the proxied routes (router/http/proxy.py), the Responses
API's (router/http/responses_routes.py) and the app (app.py) on one port, and runs it in a background thread (tests,
embedding) or in the
foreground (the CLI, a worker on an inherited socket). ``companions`` start after the runtime and
stop before it (a serve worker's ``ControlFollower``, router/control/follow.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import socket
import threading
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Protocol

from kvmesh.replica.openai.responses_api.open_store import open_store
from kvmesh.replica.openai.responses_api.service import ResponsesService
from kvmesh.router.config import ReplicaSpec, RouterConfig
from kvmesh.router.control.app import auth_rule, build_app, error_counter, served_model
from kvmesh.router.control.runtime import RouterRuntime
from kvmesh.router.http.door import Door
from kvmesh.router.http.proxied_routes import proxied_routes
from kvmesh.router.http.proxy import Forwarder
from kvmesh.router.http.responses_routes import ResponsesRoutes

if TYPE_CHECKING:
    from kvmesh.replica.serving.tokenizer import Tokenizer

logger = logging.getLogger(__name__)


class Companion(Protocol):
    """Something that runs beside the router: started once it serves, stopped before it stops."""

    async def start(self) -> None: ...
    async def stop(self) -> None: ...


class RouterServer:
    """The router behind its door (router/http/door.py): ``start()`` in a thread (returns once listening),
    ``run()`` in the foreground until SIGINT/SIGTERM, ``serve()`` inside a running loop."""

    def __init__(self, config: RouterConfig, replicas: list[ReplicaSpec] | None = None,
                 tokenizer: Tokenizer | None = None, extra_headers: list[tuple[bytes, bytes]] | None = None) -> None:
        self.config = config
        self.runtime = RouterRuntime(config, replicas, tokenizer)
        self.app = build_app(self.runtime)
        forwarder, auth = Forwarder(self.runtime.plane), auth_rule(config, self.runtime.tenants)
        self.door = Door(proxied_routes(forwarder, auth, served_model(config)), self.app, config.frontend,
                         extra_headers)
        """Where every request enters (router/http/door.py)."""
        self.responses = ResponsesService(open_store(config.responses, config.frontend), lambda: served_model(config))
        """``/v1/responses`` (router/http/responses_routes.py); its store is the database ``config.responses`` names,
        shared by every router that names it (replica/openai/responses_api/store.py)."""
        logger.info("stored responses: %s", config.responses.where())
        ResponsesRoutes(forwarder, auth, self.responses, self.runtime.tenants, served_model(config)).install(self.door)
        self.door.on_error = error_counter(self.runtime)
        self.companions: list[Companion] = []
        """Run beside the router (started after the runtime, stopped before it)."""
        self.port = config.port
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    async def serve(self, sock: socket.socket | None = None, graceful_s: float = 2.0, drain_s: float = 0.0,
                    started: threading.Event | None = None, tune_gc: bool = False) -> None:
        """Run the runtime (the app's lifespan) and serve until ``request_stop``; then shut down gracefully
        (``drain_s``: keep answering open connections with ``Connection: close`` first). ``tune_gc``: the process is
        the router's own (``run``): once listening, what start-up built is frozen out of the garbage collector and
        young collections are made rarer (``_tune_gc``)."""
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._drain_s = drain_s
        async with self.door.asgi.lifespan(), contextlib.AsyncExitStack() as companions:
            for companion in self.companions:
                await companion.start()
                companions.push_async_callback(companion.stop)
            self.port = await self.door.listen(self.config.host, self.config.port, sock)
            if tune_gc:
                _tune_gc()
            logger.info("kvmesh-router listening on %s", self.url)
            if started is not None:
                started.set()
            await self._stop.wait()
            await self.door.shutdown(graceful_s, self._drain_s)
        self.responses.close()

    def request_stop(self, drain_s: float | None = None) -> None:
        """Stop serving (thread-safe); ``drain_s`` replaces the drain period given to ``serve``."""
        if self._loop is None or self._stop is None:
            return

        def stop() -> None:
            if drain_s is not None:
                self._drain_s = drain_s
            self._stop.set()

        self._loop.call_soon_threadsafe(stop)

    def run(self, sock: socket.socket | None = None, graceful_s: float = 2.0, drain_s: float = 0.0) -> None:
        """Serve in the foreground until SIGINT (shut down) or SIGTERM (drain ``drain_s``, then shut down)."""
        async def main() -> None:
            loop = asyncio.get_running_loop()
            loop.add_signal_handler(signal.SIGINT, self.request_stop, 0.0)
            loop.add_signal_handler(signal.SIGTERM, self.request_stop)
            await self.serve(sock, graceful_s, drain_s, tune_gc=True)

        _run(main())

    def start(self, timeout: float = 30.0) -> RouterServer:
        started, error = threading.Event(), []

        def run() -> None:
            try:
                _run(self.serve(started=started))
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                error.append(e)
                started.set()

        self._thread = threading.Thread(target=run, name="kvmesh-router", daemon=True)
        self._thread.start()
        if not started.wait(timeout) or error:
            raise RuntimeError(f"router did not start listening on {self.config.host}:{self.config.port}: "
                               f"{error[0] if error else 'timeout'}")
        return self

    def stop(self) -> None:
        if self._thread is None:
            return
        self.request_stop()
        self._thread.join(15)
        self._thread = None


_YOUNG_THRESHOLD = 10_000
"""Net new container objects between two young collections in the router's own process (CPython's default: 700)."""


def _tune_gc() -> None:
    """Move every object alive now (modules, the tokenizer, the app, the replica set) out of the garbage collector's
    generations, as the replica does once its engine is built (replica/engine/build.py): a full collection then
    scans only what serving made since, not the whole start-up heap again (~67 ms of CPU each, one every ~1.3 CPU
    seconds of a loaded router: ~5%; 2 ms once frozen). Frozen objects stay alive, as they would anyway.

    Young collections then wait for ``_YOUNG_THRESHOLD`` net new objects: at CPython's 700, the requests in flight
    (each holding lists of ~1,000 token ids) crossed it every ~25 requests and each collection traversed all of
    them again (~0.24 ms; ~4% of the CPU with the older generations' share); at 10,000 a steady load makes almost
    none, as requests free what they made. Cyclic garbage waits a little longer, bounded by the threshold."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


def _run(main: Coroutine[object, object, None]) -> None:
    """``main`` on a new loop until it returns: uvloop's when it is installed, else asyncio's (``asyncio.Runner``,
    which takes a loop factory, is Python 3.11's)."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    uvloop.run(main)
