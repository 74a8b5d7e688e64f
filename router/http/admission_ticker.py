"""The admission queue's recheck: while a model has requests waiting in the router, its queue is pumped every
``admission.recheck_interval_s`` (room may come without an event: a replica's load report, a prediction's end), besides
each arrival and each request's end (router/http/admission_gate.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class Ticker:
    """One task per model with waiters, pumping it every ``interval_s`` until its queue is empty."""

    def __init__(self, interval_s: float, waiting: Callable[[str], bool], pump: Callable[[str], None]) -> None:
        self.interval_s = interval_s
        self.waiting = waiting
        """Whether a model has requests waiting."""
        self.pump = pump
        self._tasks: dict[str, asyncio.Task] = {}

    @property
    def running(self) -> frozenset[str]:
        """The models being pumped now."""
        return frozenset(self._tasks)

    def start(self, model: str) -> None:
        """Pump ``model`` every ``interval_s`` while its queue is not empty (a running ticker is kept)."""
        if model in self._tasks:
            return

        async def tick() -> None:
            try:
                while self.waiting(model):
                    await asyncio.sleep(self.interval_s)
                    self.pump(model)
            finally:
                self._tasks.pop(model, None)

        self._tasks[model] = asyncio.get_running_loop().create_task(tick())
