"""What one policy's simulated run produced (loop.py's ``run_policy`` returns it; report.py summarizes it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvmesh.cluster.measure.sim.replica import SimReplica, SimRequest
    from kvmesh.cluster.measure.sim.router import SimRouter


@dataclass
class SimRun:
    """Everything one policy's run produced (summarized by :mod:`.report`)."""

    policy: str
    """Routing policy name."""
    requests: list[SimRequest]
    """The requests, with their measured timelines."""
    replicas: list[SimReplica]
    """Every replica that existed during the run."""
    router: SimRouter
    """The simulated router(s) at the end of the run."""
    wall_s: float = 0.0
    """Wall seconds of the run."""
    cpu_s: float = 0.0
    """Process CPU seconds (wall time on a shared machine overstates the cost)."""
    route_s: float = 0.0
    """Wall seconds in key computation + match + choose."""
    extra: dict = field(default_factory=dict)
    """What the fleet policy measured (``AutoscaledFleet``: replica-seconds, timeline, decisions)."""
