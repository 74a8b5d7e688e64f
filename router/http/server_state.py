"""``DoorState``: what a door shares with every client connection it accepted (uvicorn's pattern): its limits,
how a request is answered, the open connections, whether it drains."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from kvmesh.replica.openai.config import FrontendConfig
from kvmesh.replica.serving.errors import ProtocolError

if TYPE_CHECKING:
    from kvmesh.router.http.messages import HttpRequest


class OpenConnection(Protocol):
    """What the door does to a connection it accepted when it shuts down (``HttpConnection``)."""

    def close_if_idle(self) -> None: ...

    def abort(self) -> None: ...


@dataclass(eq=False, slots=True)
class DoorState:
    """What a door shares with every connection it accepted (as uvicorn's ``ServerState``)."""

    config: FrontendConfig
    """The front end's limits and timeouts."""
    answer: Callable[[Any, HttpRequest], Awaitable[bool]]
    """Answers one request on its ``HttpConnection``; whether the connection stays open (``Door.answer``)."""
    extra_head: bytes = b""
    """Header lines every response carries (a worker's index)."""
    connections: set[OpenConnection] = field(default_factory=set)
    """The open connections."""
    draining: bool = False
    """Shutting down: every answer closes its connection."""
    on_error: Callable[[ProtocolError], None] | None = None
    """Sees errors answered by the server itself (400, 413, 500) (the router counts them)."""
