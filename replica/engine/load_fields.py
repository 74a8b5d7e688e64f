"""Helpers of ``AsyncLLM.load_report``: reading racily off the engine thread's state, the event stream's fields."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from kvmesh.replica.interfaces import EventPublisher, StreamPublisher

T = TypeVar("T")


def read_racily(read: Callable[[], list[T]]) -> list[T]:
    """``read()`` retried while the engine thread mutates the dict it iterates (gives up empty)."""
    for _ in range(5):
        try:
            return read()
        except RuntimeError:
            continue
    return []


def event_stream_report(publisher: EventPublisher | None) -> dict[str, int | float]:
    """``LoadReport``'s event fields of a ``ZmqEventPublisher`` (none for no or another publisher)."""
    if not isinstance(publisher, StreamPublisher):
        return {}
    return {"kv_events_seq": publisher.seq - 1, "kv_events_unsent_s": publisher.unsent_s()}
