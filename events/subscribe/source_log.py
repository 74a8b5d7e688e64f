"""What one source's troubles say in the log: the first restart or loss of a source as a warning, later ones only
at debug level (a flapping source must not flood the log; ``SourceStats`` counts every one)."""

from __future__ import annotations

import logging

logger = logging.getLogger("kvmesh.events.subscribe.tracker")


class SourceLog:
    """The log lines of the source named ``name`` (its ``SourceTracker`` calls these)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._warned: set[str] = set()

    def restarted(self, seq: int, last: int) -> None:
        self._once("restart", "source %s restarted (seq %d after %d)", seq, last)

    def lost(self, reason: str) -> None:
        self._once("lost", "source %s: events lost and not recoverable (%s)", reason)

    def joined_late(self, seq: int) -> None:
        logger.info("source %s: joined its stream at seq %d; it has no replay endpoint, so what it published "
                    "before is not known here", self.name, seq)

    def _once(self, kind: str, msg: str, *args) -> None:
        level = logging.DEBUG if kind in self._warned else logging.WARNING
        self._warned.add(kind)
        logger.log(level, msg + ("" if level == logging.DEBUG else "; further ones are only counted"), self.name,
                   *args)
