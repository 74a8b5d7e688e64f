"""One router worker's life: the router served on an inherited socket, draining on SIGTERM.

``serve_router`` is the one function coupling router/workers.py to the HTTP front (``RouterServer``).
Responses carry ``x-kvmesh-router-worker: <index>``. On SIGTERM the worker stops accepting (the
other workers take new connections) and for ``drain_s`` answers what still arrives on its open
connections with ``Connection: close`` (a keep-alive client that sent its next request at that
moment gets its answer, then reconnects to a live worker); then idle connections close and
in-flight requests finish (router/http/server.py ``shutdown``). SIGINT skips the drain.
"""

from __future__ import annotations

import socket

WORKER_HEADER = b"x-kvmesh-router-worker"
"""Response header naming the worker that served a request (its index)."""


DEFAULT_DRAIN_S = 5.0
"""Seconds a worker told to stop keeps answering its open connections (with ``Connection: close``)."""


def serve_router(config, replicas, sock: socket.socket, worker_index: int,
                 drain_s: float = DEFAULT_DRAIN_S, setup=None) -> None:
    """Serve the router on an inherited listening socket until SIGTERM (one worker's life).

    ``setup(runtime, app, worker_index) -> app`` (router/worker_setup.py) joins the worker to its
    siblings: shared in-flight counts, and inside ``kvmesh serve`` the control router it follows.
    """
    from kvmesh.router.server import RouterServer

    server = RouterServer(config, replicas, extra_headers=[(WORKER_HEADER, str(worker_index).encode())])
    if setup is not None:
        server.use_app(setup(server.runtime, server.app, worker_index))
    server.run(sock=sock, graceful_s=config.request_timeout_s or 600.0, drain_s=drain_s)
