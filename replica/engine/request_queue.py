"""The scheduler's waiting queue under each scheduling policy (vLLM v1's ``request_queue.py``).

- ``fcfs``: arrival order; a preempted request goes back to the front.
- ``priority``: the smallest ``(priority, arrival_time)`` first (lower priority values are served first, as
  vLLM); a preempted request keeps its arrival time, so it goes back to its place in that order.

The scheduler only peeks, pops, adds, prepends (preemption) and removes (abort); iteration yields the
requests in the order they would be admitted.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Iterator
from typing import Protocol

from kvmesh.replica.config import SCHEDULING_POLICIES
from kvmesh.replica.engine.request import Request


def priority_key(request: Request) -> tuple[int, float]:
    """The priority policy's order: admitted smallest first, preempted largest first."""
    return request.priority, request.arrival_time


class RequestQueue(Protocol):
    """What the scheduler asks of its waiting queue."""

    def add_request(self, request: Request) -> None: ...

    def prepend_request(self, request: Request) -> None: ...

    def peek_request(self) -> Request: ...

    def pop_request(self) -> Request: ...

    def remove_request(self, request: Request) -> None: ...

    def __contains__(self, request: object) -> bool: ...

    def __len__(self) -> int: ...

    def __bool__(self) -> bool: ...

    def __iter__(self) -> Iterator[Request]: ...


class FCFSRequestQueue(deque):
    """Arrival order (a deque): new requests at the back, preempted ones at the front."""

    def add_request(self, request: Request) -> None:
        self.append(request)

    def prepend_request(self, request: Request) -> None:
        self.appendleft(request)

    def peek_request(self) -> Request:
        return self[0]

    def pop_request(self) -> Request:
        return self.popleft()

    def remove_request(self, request: Request) -> None:
        self.remove(request)


class PriorityRequestQueue:
    """A heap on ``key(request)`` (``(priority, arrival_time)``); ties keep insertion order. The simulator's replicas
    queue their requests in it too, by their own key (cluster/measure/sim/priority.py)."""

    def __init__(self, key: Callable[[Request], tuple[int, float]] = priority_key) -> None:
        self._heap: list[tuple[int, float, int, Request]] = []
        self._seq = itertools.count()
        self._key = key

    def add_request(self, request: Request) -> None:
        heapq.heappush(self._heap, (*self._key(request), next(self._seq), request))

    def prepend_request(self, request: Request) -> None:
        self.add_request(request)  # its own (priority, arrival) places it: preempted requests arrived earlier

    def peek_request(self) -> Request:
        return self._heap[0][3]

    def pop_request(self) -> Request:
        return heapq.heappop(self._heap)[3]

    def remove_request(self, request: Request) -> None:
        for i, entry in enumerate(self._heap):
            if entry[3] is request:
                self._heap[i] = self._heap[-1]
                self._heap.pop()
                heapq.heapify(self._heap)
                return
        raise ValueError(f"{request!r} is not waiting")

    def __contains__(self, request: object) -> bool:
        return any(entry[3] is request for entry in self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return (entry[3] for entry in sorted(self._heap, key=lambda e: e[:3]))


def create_request_queue(policy: str) -> RequestQueue:
    """The waiting queue of ``policy`` ("fcfs" or "priority")."""
    if policy == "priority":
        return PriorityRequestQueue()
    if policy == "fcfs":
        return FCFSRequestQueue()
    raise ValueError(f"scheduling_policy must be one of {SCHEDULING_POLICIES}, got {policy!r}")
