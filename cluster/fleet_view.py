"""What the fleet answers the router's admin API (``GET /admin/fleet``, ``POST /admin/scale`` and
``/admin/rollout``): the replica set, the operations queued and done, the autoscaler's decisions."""

from __future__ import annotations

from typing import TypedDict

from kvmesh.cluster.autoscaler import DecisionDict

EngineChanges = dict[str, str | int | float | bool | None]
"""``EngineConfig`` fields a rollout changes, as the admin request's JSON gives them (checked by ``replace``)."""


class AutoscaleView(TypedDict):
    """The autoscaler's settings, as ``GET /admin/fleet`` shows them."""

    enabled: bool
    min_replicas: int
    max_replicas: int
    target_in_flight: float
    target_queued_prefill_tokens: int


class Operation(TypedDict):
    """A finished fleet operation."""

    operation: str
    started: float
    seconds: float
    outcome: str


class FleetView(TypedDict):
    """``GET /admin/fleet``: the replica set, the operation under way and the recent history."""

    replicas: list[str]
    target: int
    busy: str | None
    queued: int
    autoscale: AutoscaleView
    decisions: list[DecisionDict]
    operations: list[Operation]


class Accepted(TypedDict, total=False):
    """The answer to a queued scale or rollout request."""

    accepted: bool
    operation: str
    replicas: list[str]
    engine_changes: list[str]
