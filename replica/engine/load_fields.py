"""The ``/load`` fields ``AsyncLLM.load_report`` reads racily off the engine thread's state."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from kvmesh.replica.interfaces import EventPublisher, StreamPublisher

T = TypeVar("T")


def host_tier_report(engine) -> dict:
    """The ``/load`` fields of the engine's host tier and its copies (none without a tier)."""
    offload = engine.kv_cache_manager.offload
    copier = engine.model_runner.kv_offload
    if offload is None or copier is None:
        return {}
    return {"kv_block_bytes": copier.block_bytes, "h2d_bytes_per_s": copier.h2d_bytes_per_s,
            "num_host_kv_blocks": offload.host.num_blocks, "host_kv_cache_usage": offload.host.usage()}


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
