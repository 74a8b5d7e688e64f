"""The simulator's events (sim/loop.py): their kinds, in the order of ``range``, and what each carries. The loop
orders them by (time, insertion order), so runs are deterministic:

- arrival: tokenize (token ids per hash id), compute router keys, match, choose, enqueue;
- step end: a replica finishes a step (or a stretch of decode steps), frees finished requests,
  plans its next step;
- event delivery: a batch of a replica's BlockStored/BlockRemoved reaches the index;
- load poll (``load_poll_s > 0``): one router reads every replica's ``/load``; the routers' polls
  are staggered over the interval;
- fleet timer / fleet event: the fleet policy's own (``FixedFleet`` has none; the autoscaler's
  ticks and replica joins, ``scaling.AutoscaledFleet``);
- moved: a request whose KV transfer ended joins its replica's queue (a peer pull at arrival, or a split's
  hand-off when its prefill leg finished on the prefill replica; sim/transfer.py).
- admit (``admission``): a waiter's deadline came due in the router's admission queue (sim/admission.py),
  which is also pumped at every arrival and step end; a request it sheds is never served;
- decide (``turn_s``, routers that sync taking turns): a request's router's turn came, and it is routed.
"""

from __future__ import annotations

from kvmesh.cluster.measure.sim.replica import SimReplica, SimRequest
from kvmesh.events.schema import KVEvent

STEP_END, EVENTS, POLL, FLEET_TIMER, FLEET_EVENT, MOVED, ADMIT, LOAD, LOAD_DUE, DECIDE = range(10)
RECURRING = (POLL, FLEET_TIMER)
"""Timers that repeat while the run is busy: a run may end with them still queued."""

Payload = (tuple[SimReplica, int] | tuple[str, list[KVEvent]] | tuple[SimReplica, SimRequest] | tuple[SimRequest, int]
           | str | None)
"""What an event carries: (replica, version) of a step end, (replica id, events) of a delivery, a
router's index (poll), (replica, request) of a move, (request, its router) of a decision in that router's turn, or a
fleet's own (``AutoscaledFleet``: a joining replica's id, None for a tick)."""
