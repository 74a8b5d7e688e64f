"""Helpers of ``AsyncLLM.load_report``: reading racily off the engine thread's state, the event stream's fields,
the LoRA section."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from kvmesh.replica.engine.loras import EngineLoRAs
from kvmesh.replica.engine.request import Request
from kvmesh.replica.interfaces import EventPublisher, StreamPublisher
from kvmesh.replica.serving.load_report import LoRALoad

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


def lora_report(loras: EngineLoRAs, running: list[Request]) -> LoRALoad:
    """``LoadReport.lora`` (adapters, slots, the running requests' adapters), read racily off the engine thread:
    retried while it mutates what is read; an empty section with the engine's settings if it kept changing."""
    for _ in range(5):
        try:
            return loras.load([r.lora_name for r in list(running)])
        except RuntimeError:
            continue
    return LoRALoad(enabled=loras.enabled, max_loras=loras.max_loras, max_lora_rank=loras.max_lora_rank)
