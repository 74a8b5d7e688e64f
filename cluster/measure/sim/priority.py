"""A simulated replica's waiting queue under the engine's scheduling policy (replica/engine/request_queue.py):
``fcfs`` is a deque in arrival order; ``priority`` serves the smallest ``(priority, arrival_s)`` first, as the
engine's ``--scheduling-policy priority`` does. A simulated replica allocates a request's blocks in full on
admission, so it never preempts: the engine's other half of the policy (the lowest priority preempted first)
has nothing to act on here."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from kvmesh.cluster.measure.sim.request import SimRequest
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.engine.request_queue import PriorityRequestQueue


class PriorityWaiting(PriorityRequestQueue):
    """The engine's priority heap (replica/engine/request_queue.py) keyed by ``(priority, arrival_s)``, with the deque
    operations a simulated replica uses (append, [0], popleft, extendleft)."""

    def __init__(self) -> None:
        super().__init__(key=lambda req: (req.priority, req.arrival_s))

    def append(self, req: SimRequest) -> None:
        self.add_request(req)

    def __getitem__(self, index: int) -> SimRequest:
        if index != 0:
            raise IndexError("a priority queue shows only its head")
        return self.peek_request()

    def popleft(self) -> SimRequest:
        return self.pop_request()

    def extendleft(self, reqs: Iterable[SimRequest]) -> None:
        """Put requests taken off the head back (their places come from their priority and arrival)."""
        for req in reqs:
            self.add_request(req)


def waiting_queue(engine: EngineConfig) -> deque[SimRequest] | PriorityWaiting:
    """The waiting queue of ``engine.scheduling_policy``."""
    return PriorityWaiting() if engine.scheduling_policy == "priority" else deque()
