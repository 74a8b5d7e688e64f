"""A simulated replica's waiting queue under the engine's scheduling policy (replica/engine/request_queue.py):
``fcfs`` is a deque in arrival order; ``priority`` serves the smallest ``(priority, arrival_s)`` first, as the
engine's ``--scheduling-policy priority`` does. A simulated replica allocates a request's blocks in full on
admission, so it never preempts: the engine's other half of the policy (the lowest priority preempted first)
has nothing to act on here."""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Iterable, Iterator

from kvmesh.cluster.measure.sim.request import SimRequest
from kvmesh.replica.config import EngineConfig


class PriorityWaiting:
    """The deque operations a simulated replica uses (append, [0], popleft, extendleft, len, iteration), in priority order."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, SimRequest]] = []
        self._seq = itertools.count()

    def append(self, req: SimRequest) -> None:
        heapq.heappush(self._heap, (req.priority, req.arrival_s, next(self._seq), req))

    def __getitem__(self, index: int) -> SimRequest:
        if index != 0:
            raise IndexError("a priority queue shows only its head")
        return self._heap[0][3]

    def popleft(self) -> SimRequest:
        return heapq.heappop(self._heap)[3]

    def extendleft(self, reqs: Iterable[SimRequest]) -> None:
        """Put requests taken off the head back (their places come from their priority and arrival)."""
        for req in reqs:
            self.append(req)

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __iter__(self) -> Iterator[SimRequest]:
        return (entry[3] for entry in sorted(self._heap, key=lambda e: e[:3]))


def waiting_queue(engine: EngineConfig) -> deque[SimRequest] | PriorityWaiting:
    """The waiting queue of ``engine.scheduling_policy``."""
    return PriorityWaiting() if engine.scheduling_policy == "priority" else deque()
