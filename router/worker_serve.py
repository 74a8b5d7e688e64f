"""One router worker's life: the router app served on an inherited socket, draining on SIGTERM.

``serve_router`` is the one function coupling router/workers.py to the HTTP app (build_app +
RouterRuntime). Responses carry ``x-kvmesh-router-worker: <index>``; on SIGTERM the worker
stops accepting (the other workers take new connections), answers what still arrives on its
open connections with ``Connection: close``, then runs uvicorn's graceful shutdown.
"""

from __future__ import annotations

import signal
import socket

WORKER_HEADER = b"x-kvmesh-router-worker"
"""Response header naming the worker that served a request (its index)."""


DEFAULT_DRAIN_S = 5.0
"""Seconds a worker told to stop keeps answering its open connections (with ``Connection: close``)."""


def serve_router(config, replicas, sock: socket.socket, worker_index: int,
                 drain_s: float = DEFAULT_DRAIN_S, setup=None) -> None:
    """Serve the router app on an inherited listening socket until SIGTERM (one worker's life).

    ``setup(runtime, app, worker_index) -> app`` (router/worker_setup.py) joins the worker to its
    siblings: shared in-flight counts, and inside ``kvmesh serve`` the control router it follows.
    """
    from kvmesh.replica.openai.runner import uvicorn_config
    from kvmesh.router.runtime import RouterRuntime
    from kvmesh.router.server import build_app

    drain = _Drain()
    runtime = RouterRuntime(config, replicas)
    app = build_app(runtime)
    if setup is not None:
        app = setup(runtime, app, worker_index)
    app = _tag_worker(app, worker_index, drain)
    server_config = uvicorn_config(app, config.frontend, graceful_s=config.request_timeout_s or 600.0,
                                   lifespan="on")
    _draining_server_class()(server_config, drain, drain_s).run(sockets=[sock])


class _Drain:
    """Set once the worker was told to stop: responses then close their connection."""

    draining = False


def _tag_worker(app, worker_index: int, drain: _Drain):
    """The ASGI app, answering with ``WORKER_HEADER`` (and ``Connection: close`` while draining)."""
    header = (WORKER_HEADER, str(worker_index).encode())
    closing = [header, (b"connection", b"close")]

    async def tagged(scope, receive, send):
        if scope["type"] != "http":
            return await app(scope, receive, send)

        async def send_tagged(message):
            if message["type"] == "http.response.start":
                extra = closing if drain.draining else [header]
                message = {**message, "headers": [*message.get("headers", ()), *extra]}
            await send(message)

        return await app(scope, receive, send_tagged)

    return tagged


def _draining_server_class():
    """uvicorn's Server whose SIGTERM drains before its own graceful shutdown.

    A plain graceful shutdown closes idle keep-alive connections at once, and a client that
    sent its next request on one at that moment sees it fail although the request never started.
    Draining instead stops accepting, answers every request still arriving on an open connection
    with ``Connection: close`` (the client reconnects to a live worker for the next one), and
    only after the connections are gone (or ``drain_s``) runs uvicorn's shutdown.
    """
    import asyncio

    import uvicorn

    class DrainingServer(uvicorn.Server):
        def __init__(self, config, drain: _Drain, drain_s: float) -> None:
            super().__init__(config)
            self.drain, self.drain_s = drain, drain_s
            self._loop = None

        async def serve(self, sockets=None) -> None:
            self._loop = asyncio.get_running_loop()
            await super().serve(sockets)

        def handle_exit(self, sig, frame) -> None:
            if sig != signal.SIGTERM or self.drain.draining or self._loop is None:
                return super().handle_exit(sig, frame)
            self.drain.draining = True
            self._captured_signals.append(sig)  # re-raised after shutdown, as uvicorn does
            self._loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._drain_then_exit()))

        async def _drain_then_exit(self) -> None:
            for server in self.servers:
                server.close()  # stop accepting; the other workers take new connections
            deadline = self._loop.time() + self.drain_s
            while self.server_state.connections and self._loop.time() < deadline:
                await asyncio.sleep(0.05)
            self.should_exit = True

    return DrainingServer
