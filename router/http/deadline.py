"""A re-armable timeout that keeps one loop timer, for timeouts set and cleared on every request.

    deadline = Deadline(loop, on_expiry)
    deadline.arm(10.0)       # on_expiry() runs 10 s from now unless disarmed or re-armed first
    deadline.disarm()
    deadline.cancel()        # the connection closed: drop the timer too

Creating and cancelling a ``TimerHandle`` costs ~2-3 µs and the router did it three times per proxied
request (the header and keep-alive timeouts of the client connection, the read timeout of the replica
connection). Here arming only moves ``when``; the one timer, when it fires early (re-armed later since
it was scheduled), is scheduled again for the rest. A new timer is made only when the deadline moves
earlier than the pending one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

_RESOLUTION_S = 1e-3
"""A timer may fire this much before its time (uvloop's clock has millisecond steps): that is on time."""


class Deadline:
    """See the module doc."""

    __slots__ = ("loop", "callback", "when", "_timer")

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
        self.loop = loop
        self.callback = callback
        self.when: float | None = None
        """Loop time at which ``callback`` runs; None: disarmed."""
        self._timer: asyncio.TimerHandle | None = None

    @property
    def armed(self) -> bool:
        return self.when is not None

    def arm(self, seconds: float) -> None:
        when = self.when = self.loop.time() + seconds
        timer = self._timer
        if timer is None or timer.when() > when:
            if timer is not None:
                timer.cancel()
            self._timer = self.loop.call_at(when, self._fire)

    def disarm(self) -> None:
        self.when = None

    def cancel(self) -> None:
        self.when = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self) -> None:
        self._timer = None
        when = self.when
        if when is None:
            return
        if when - self.loop.time() > _RESOLUTION_S:  # re-armed since this timer was scheduled
            self._timer = self.loop.call_at(when, self._fire)
            return
        self.when = None
        self.callback()
