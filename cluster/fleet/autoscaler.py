"""Autoscaling policy: how many replicas the traffic wants, and which one to lose when fewer will do.

    load per replica (router's GET /replicas, every decision_interval_s):
        in flight (router's own count;  vs target_in_flight
          the replica's own when larger:
          routers on other hosts), plus the
          requests every router's admission
          holds (``waiting``: the owner's,
          and each placed router's)
        queued prefill tokens (/load)   vs target_queued_prefill_tokens (0 = not used)
    desired = ceil(max(sum in flight / target_in_flight, sum prefill / target_prefill)), in [min, max]

    desired > current for upscale_delay_s    -> scale up to desired (several at once)
    desired < current for downscale_delay_s  -> scale down by one: drain the replica whose loss costs
                                                the least cached reuse (fewest blocks no other replica
                                                holds, then fewest in flight), then remove it

The policy is pure (``Autoscaler.observe`` takes the time and the rows), so tests and the simulator
drive it with their own clock; ``cluster/fleet/operations.py`` runs it against a live cluster.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvmesh.cluster.config.autoscale import AutoscaleConfig

DecisionDict = dict[str, str | float | None]
"""A ``Decision`` as JSON (``GET /admin/fleet``, ``kvmesh status``)."""


@dataclass(frozen=True, slots=True)
class Decision:
    """One scaling decision (logged, counted in metrics, listed by ``kvmesh status``)."""

    at: float
    """Clock time of the decision (the caller's clock)."""
    action: str
    """"up" or "down"."""
    current: int
    """Replicas serving (not draining) when decided."""
    target: int
    """Replicas wanted."""
    reason: str
    """The load that led to it, in words."""
    victim: str | None = None
    """Scale down: the replica to drain."""

    def as_dict(self) -> DecisionDict:
        return {name: getattr(self, name) for name in self.__slots__}

    def describe(self) -> str:
        """In words, for the log and the operator: ``down 3 -> 2 replicas (why); draining replica-1``."""
        return (f"{self.action} {self.current} -> {self.target} replicas ({self.reason})"
                + (f"; draining {self.victim}" if self.victim else ""))


def desired_replicas(config: AutoscaleConfig, rows: list[dict], waiting: int = 0) -> tuple[int, str]:
    """Replicas the load wants, and why; ``rows`` are ``GET /replicas`` rows of serving replicas, ``waiting`` the
    requests the routers' admission holds (each router's ``waiting``, summed): a router that queues what its replicas
    cannot start soon keeps their in-flight counts at what they run, so without them a saturated fleet looks
    right-sized."""
    in_flight = sum(max(int(r.get("in_flight", 0)), int(r.get("running", 0))) for r in rows) + waiting
    prefill = sum(int(r.get("prefill_backlog", 0)) for r in rows)
    want = in_flight / config.target_in_flight
    reason = f"{in_flight} in flight" + (f", {waiting} waiting in the routers" if waiting else "") \
        + f" (target {config.target_in_flight:g}/replica)"
    if config.target_queued_prefill_tokens:
        want = max(want, prefill / config.target_queued_prefill_tokens)
        reason += f", {prefill} queued prefill tokens (target {config.target_queued_prefill_tokens}/replica)"
    desired = min(config.max_replicas, max(config.min_replicas, math.ceil(want - 1e-9)))
    return desired, reason


def cheapest_to_lose(rows: list[dict]) -> str:
    """The serving replica whose loss costs the least cached reuse (then the least work in flight)."""
    return min(rows, key=lambda r: (int(r.get("exclusive_blocks", 0)), int(r.get("in_flight", 0)), r["id"]))["id"]


class Autoscaler:
    """Turns a stream of load observations into scaling decisions (see the module doc)."""

    def __init__(self, config: AutoscaleConfig) -> None:
        self.config = config
        self._want_since: dict[str, float] = {}  # "up"/"down" -> when that wish began

    def observe(self, now: float, rows: list[dict], waiting: int = 0) -> Decision | None:
        """One look at the owner's replica rows (and the requests the routers' admission holds); a decision when one
        is due (then the timers restart)."""
        serving = [r for r in rows if not r.get("draining")]
        current = len(serving)
        desired, reason = desired_replicas(self.config, serving, waiting)
        if current < self.config.min_replicas:  # below the floor: no delay
            self._want_since.clear()
            return Decision(now, "up", current, self.config.min_replicas, f"below min_replicas; {reason}")
        direction = "up" if desired > current else "down" if desired < current else None
        for other in ("up", "down"):
            if other != direction:
                self._want_since.pop(other, None)
        if direction is None:
            return None
        since = self._want_since.setdefault(direction, now)
        delay = self.config.upscale_delay_s if direction == "up" else self.config.downscale_delay_s
        if now - since < delay:
            return None
        self._want_since.clear()
        if direction == "up":
            return Decision(now, "up", current, desired, reason)
        return Decision(now, "down", current, current - 1, reason, victim=cheapest_to_lose(serving))
