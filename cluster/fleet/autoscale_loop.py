"""The autoscaler against a live cluster: router rows in, fleet operations out (see ``autoscaler.py``).

Every ``autoscale.decision_interval_s``, while the fleet is idle: ``GET /replicas`` of serve's
replicas -> ``Autoscaler.observe``; a scale-down re-reads the rows with their drain cost
(``?drain_cost=true``) to pick the victim. Each decision is logged, reported, counted in
``kvmesh_autoscaler_decisions_total{action}`` and kept for ``GET /admin/fleet`` / ``kvmesh status``.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING

import msgspec
from kvmesh.cluster.fleet.autoscaler import Autoscaler, cheapest_to_lose

if TYPE_CHECKING:
    from kvmesh.cluster.fleet.operations import Fleet
    from prometheus_client import CollectorRegistry

logger = logging.getLogger(__name__)


class AutoscaleLoop:
    """``run(stop)`` is the autoscaler thread of a ``Fleet``."""

    def __init__(self, fleet: Fleet, registry: CollectorRegistry) -> None:
        from prometheus_client import Counter

        self.fleet = fleet
        self.config = fleet.config
        self.autoscaler = Autoscaler(self.config)
        self.counter = Counter("kvmesh_autoscaler_decisions", "Scaling decisions, by action", ["action"],
                               registry=registry)

    def run(self, stop: threading.Event) -> None:
        fleet = self.fleet
        while not stop.wait(self.config.decision_interval_s):
            if fleet.busy is not None or fleet.queued:
                continue
            try:
                self.look()
            except Exception as e:  # the router is stopping, or a hiccup: look again next interval
                logger.warning("autoscaler: %s: %s", type(e).__name__, e)

    def look(self) -> None:
        """One observation; queues the operation a decision calls for."""
        fleet = self.fleet
        client = fleet.st.router_client
        ids = set(fleet.replica_ids())
        rows = [msgspec.to_builtins(r) for r in client.replica_rows() if r.id in ids]
        decision = self.autoscaler.observe(time.monotonic(), rows)
        if decision is None:
            return
        if decision.action == "down":  # the victim by drain cost, which the router computes on request
            costly = [msgspec.to_builtins(r) for r in client.replica_rows(drain_cost=True)
                      if r.id in ids and not r.draining]
            decision = replace(decision, victim=cheapest_to_lose(costly))
        fleet.decisions.append(decision)
        self.counter.labels(decision.action).inc()
        message = (f"autoscaler: {decision.action} {decision.current} -> {decision.target} replicas "
                   f"({decision.reason})" + (f"; draining {decision.victim}" if decision.victim else ""))
        logger.info(message)
        fleet.cluster.report(message)
        fleet.target = decision.target
        if decision.action == "up":
            fleet.enqueue(f"scale to {decision.target}", fleet.add_replicas, decision.target - len(ids))
        else:
            fleet.enqueue(f"drain {decision.victim}", fleet.remove_replica, decision.victim)
