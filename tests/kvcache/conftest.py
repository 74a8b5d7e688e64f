"""Tiny requests and event recorders for the kvcache tests."""

from __future__ import annotations

import pytest
from kvmesh.events.schema import AllBlocksCleared, BlockRemoved, BlockStored
from kvmesh.kvcache.interfaces import TokenRequest


class EventLog:
    """An event sink that also replays the events into the set of cached external hashes."""

    def __init__(self) -> None:
        self.events: list = []
        self.cached: set[int] = set()

    def __call__(self, event) -> None:
        self.events.append(event)
        if isinstance(event, BlockStored):
            self.cached.update(event.block_hashes)
        elif isinstance(event, BlockRemoved):
            self.cached.difference_update(event.block_hashes)
        elif isinstance(event, AllBlocksCleared):
            self.cached.clear()

    def of_type(self, cls) -> list:
        return [e for e in self.events if isinstance(e, cls)]

    def clear(self) -> None:
        self.events.clear()


@pytest.fixture
def event_log() -> EventLog:
    return EventLog()


@pytest.fixture
def make_request():
    def make(request_id: str, token_ids, **kwargs) -> TokenRequest:
        return TokenRequest(request_id, list(token_ids), **kwargs)

    return make


def schedule(manager, request, num_new_tokens: int | None = None):
    """One scheduler step for a new request: look up its prefix, allocate, mark it computed."""
    computed, num_computed = manager.get_computed_blocks(request)
    if num_new_tokens is None:
        num_new_tokens = request.num_tokens - num_computed
    new_blocks = manager.allocate_slots(request, num_new_tokens, num_computed, computed)
    if new_blocks is not None:
        request.num_computed_tokens += num_computed + num_new_tokens
    return computed, new_blocks


@pytest.fixture
def run_step():
    return schedule
