"""The autoscaler against a live cluster: router rows in, decisions out to the fleet (see ``autoscaler.py``).

Every ``autoscale.decision_interval_s``, while the fleet is idle: ``GET /replicas`` of serve's
replicas and the requests the owner's admission holds, plus those each router serve placed on a Ray node holds
(``placed``: cluster/launch/node_routers.py; one that does not answer in time is left out of that look and said
once) -> ``Autoscaler.observe``; a scale-down
re-reads the rows with their drain cost (``?drain_cost=true``) to pick the victim. Each decision is logged, counted in
``kvmesh_autoscaler_decisions_total{action}`` and handed to the fleet (``Fleet.apply``,
operations.py), which reports it, keeps it for ``GET /admin/fleet`` / ``kvmesh status`` and queues
the operation it calls for.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

import msgspec
from kvmesh.cluster.config.autoscale import AutoscaleConfig
from kvmesh.cluster.fleet.autoscaler import Autoscaler, Decision, cheapest_to_lose

if TYPE_CHECKING:
    from kvmesh.cluster.router_client import RouterClient
    from prometheus_client import CollectorRegistry

logger = logging.getLogger(__name__)


class HoldsRequests(Protocol):
    """A router beside the owner that routes to the fleet: how many requests its admission holds."""

    name: str

    def waiting(self) -> int:
        """Raises when the router does not answer in time."""
        ...


class AutoscaleLoop:
    """``run`` is the autoscaler thread of a fleet; ``client`` reads the router that owns the replica set, ``placed``
    gives the other routers that route to it (none: the owner's admission holds every waiting request)."""

    def __init__(self, config: AutoscaleConfig, client: RouterClient, registry: CollectorRegistry,
                 placed: Callable[[], Sequence[HoldsRequests]] = lambda: ()) -> None:
        from prometheus_client import Counter

        self.config = config
        self.client = client
        self.placed = placed
        self._silent: set[str] = set()
        """Placed routers that did not answer the last look (said once until they answer again)."""
        self.autoscaler = Autoscaler(config)
        self.counter = Counter("kvmesh_autoscaler_decisions", "Scaling decisions, by action", ["action"],
                               registry=registry)

    def run(self, stop: threading.Event, idle: Callable[[], bool], replica_ids: Callable[[], list[str]],
            apply: Callable[[Decision, int], None]) -> None:
        """Until ``stop``: while ``idle()``, one look at the rows of ``replica_ids()`` per interval; a
        decision goes to ``apply(decision, replicas seen)``."""
        while not stop.wait(self.config.decision_interval_s):
            if not idle():
                continue
            try:
                ids = set(replica_ids())
                decision = self.look(ids)
                if decision is not None:
                    apply(decision, len(ids))
            except Exception as e:  # the router is stopping, or a hiccup: look again next interval
                logger.warning("autoscaler: %s: %s", type(e).__name__, e)

    def look(self, ids: set[str]) -> Decision | None:
        """One observation of the replicas ``ids``: the decision it calls for (logged and counted), or None."""
        listed = self.client.replica_list()
        rows = [msgspec.to_builtins(r) for r in listed.replicas if r.id in ids]
        waiting = listed.waiting + self.placed_waiting()
        decision = self.autoscaler.observe(time.monotonic(), rows, waiting=waiting)
        if decision is None:
            return None
        if decision.action == "down":  # the victim by drain cost, which the router computes on request
            costly = [msgspec.to_builtins(r) for r in self.client.replica_rows(drain_cost=True)
                      if r.id in ids and not r.draining]
            decision = replace(decision, victim=cheapest_to_lose(costly))
        self.counter.labels(decision.action).inc()
        logger.info("autoscaler: %s", decision.describe())
        return decision

    def placed_waiting(self) -> int:
        """The requests the placed routers' admission holds, summed over those that answered."""
        total = 0
        for router in self.placed():
            try:
                total += router.waiting()
            except Exception as e:  # noqa: BLE001 - restarting, or its node is gone: decide on the others
                if router.name not in self._silent:
                    logger.warning("autoscaler: %s did not say how many requests it holds (%s: %s); deciding "
                                   "without them until it answers", router.name, type(e).__name__, e)
                self._silent.add(router.name)
            else:
                self._silent.discard(router.name)
        return total
