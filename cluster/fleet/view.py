"""What the fleet answers the router's admin API (``GET /admin/fleet``, ``POST /admin/scale`` and
``/admin/rollout``): the replica set, the operations queued and done, the autoscaler's decisions."""

from __future__ import annotations

from typing import TypedDict

from kvmesh.cluster.fleet.autoscaler import DecisionDict

EngineChanges = dict[str, str | int | float | bool | None]
"""``EngineConfig`` fields a rollout changes, as the admin request's JSON gives them (checked by ``replace``)."""


class AutoscaleView(TypedDict):
    """The autoscaler's settings, as ``GET /admin/fleet`` shows them."""

    enabled: bool
    """``autoscale.scale_with_load``."""
    min_replicas: int
    """Fewest replicas kept."""
    max_replicas: int
    """Most replicas started."""
    target_in_flight: float
    """Requests in flight per replica aimed for."""
    target_queued_prefill_tokens: int
    """Queued prefill tokens per replica aimed for (0 = not used)."""


class Operation(TypedDict):
    """A finished fleet operation."""

    operation: str
    """What was done (``scale to 3``, ``rollout``, ``remove replica-2``)."""
    started: float
    """Wall-clock time it started (``time.time()``)."""
    seconds: float
    """How long it took."""
    outcome: str
    """``ok`` or ``failed: ...``."""


class FleetView(TypedDict, total=False):
    """``GET /admin/fleet``: the replica set, the operation under way and the recent history."""

    replicas: list[str]
    """The replicas now."""
    roles: dict[str, str]
    """Each replica's role: prefill, decode or both (cluster/config/roles.py)."""
    target: int
    """Replicas wanted that serve requests (decode, or both)."""
    prefill_target: int
    """Prefill replicas wanted."""
    busy: str | None
    """The operation under way, if any."""
    queued: int
    """Operations waiting."""
    autoscale: AutoscaleView
    """The autoscaler's settings."""
    decisions: list[DecisionDict]
    """The autoscaler's last decisions."""
    operations: list[Operation]
    """The last finished operations."""
    deployments: dict[str, str]
    """Each replica's deployment (a cluster of several models only: deployment_fleet.py)."""


class Accepted(TypedDict, total=False):
    """The answer to a queued scale or rollout request."""

    accepted: bool
    """Always True (a refused request raises)."""
    operation: str
    """What was queued."""
    replicas: list[str]
    """The replicas when it was queued."""
    role: str
    """Scale: the role scaled (prefill, or the serving replicas' decode/both)."""
    engine_changes: list[str]
    """Rollout: the engine fields it changes."""
    deployment: str
    """The deployment scaled or rolled out (a cluster of several models)."""
