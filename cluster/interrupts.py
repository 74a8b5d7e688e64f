"""Ctrl-C and SIGTERM as exceptions in ``kvmesh serve``'s main thread, never lost.

Python raises ``KeyboardInterrupt`` wherever the main thread happens to be; when that is code whose
exceptions are only printed (an ``os.fork`` hook such as logging's, a ``__del__``), the interrupt is
swallowed and start-up would go on for minutes. So the handler remembers the signal, and a watchdog
thread delivers it again every ``redeliver_s`` until the main thread says it acted on it.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator


class Terminated(Exception):
    """SIGTERM arrived: shut down like Ctrl-C."""


class Interrupts:
    """Install with ``install()`` (again after a library replaced the handlers); ``ignore()`` once the main
    thread caught the exception, for the shutdown itself (a second Ctrl-C must not leave orphans)."""

    def __init__(self, redeliver_s: float = 1.0) -> None:
        self.redeliver_s = redeliver_s
        self._pending: int | None = None
        self._since = 0.0
        self._acted = threading.Event()
        self._main = threading.main_thread().ident
        self._watchdog: threading.Thread | None = None

    def install(self) -> None:
        signal.signal(signal.SIGINT, self._handle)
        signal.signal(signal.SIGTERM, self._handle)
        if self._watchdog is None:
            self._watchdog = threading.Thread(target=self._watch, name="kvmesh-interrupts", daemon=True)
            self._watchdog.start()

    @property
    def pending(self) -> bool:
        """A signal arrived (whether or not its exception got through)."""
        return self._pending is not None

    @property
    def exit_code(self) -> int:
        """What a shell expects of a process stopped by the signal that arrived: 128 + its number (Ctrl-C 130,
        SIGTERM 143); 0 when none did."""
        return 0 if self._pending is None else 128 + self._pending

    def ignore(self) -> None:
        self._acted.set()
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    def _handle(self, signum: int, frame) -> None:
        if self._pending is None:
            self._pending, self._since = signum, time.monotonic()
        raise KeyboardInterrupt if signum == signal.SIGINT else Terminated()

    def _watch(self) -> None:
        while not self._acted.wait(self.redeliver_s / 4):
            pending = self._pending
            if pending is not None and time.monotonic() - self._since >= self.redeliver_s:
                self._since = time.monotonic()
                signal.pthread_kill(self._main, pending)  # swallowed: raise it again


@contextlib.contextmanager
def kept_from_ray() -> Iterator[None]:
    """Keep this process's SIGINT and SIGTERM handlers while Ray starts or joins a cluster. ``ray.init`` installs
    SIGTERM handlers of its own (the driver's ``sys.exit``, the head node's) through
    ``ray._private.utils.set_sigterm_handler``: meanwhile a no-op, and a handler replaced any other way is put back
    after. A SIGTERM meanwhile is held until the block ends, then raised (serve's ``Terminated``: its shutdown, exit
    143): sent to serve alone it leaves Ray's processes running, so ``ray.init`` finishes in seconds, and raised
    half-way it left Ray's native core half set up, which aborted the process when serve shut Ray down. A second
    SIGTERM, and Ctrl-C (which reaches Ray's processes too, so ``ray.init`` fails at once anyway), are not held.
    A no-op off the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    from ray._private import utils as ray_utils

    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    held: list[int] = []

    def hold(signum: int, frame) -> None:
        if held and callable(saved[signal.SIGTERM]):
            saved[signal.SIGTERM](signum, frame)  # asked twice: act now
        held.append(signum)

    try:
        setter = ray_utils.set_sigterm_handler
    except AttributeError:  # another Ray: its handlers are undone after the block only
        setter = None
    if setter is not None:
        ray_utils.set_sigterm_handler = _ray_may_not_set
    if callable(saved[signal.SIGTERM]):
        signal.signal(signal.SIGTERM, hold)
    try:
        yield
    finally:
        if setter is not None:
            ray_utils.set_sigterm_handler = setter
        for signum, handler in saved.items():
            if handler is not None:
                signal.signal(signum, handler)
        if held:
            signal.raise_signal(signal.SIGTERM)  # to the handler just put back


def _ray_may_not_set(sigterm_handler) -> None:
    """``set_sigterm_handler`` while serve keeps its own (``kept_from_ray``)."""
