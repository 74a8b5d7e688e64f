"""The routing formulas of the systems users would run instead of kvmesh (Dynamo, llm-d, sglang-router /
vllm-router), kept on the simulator's side to be compared against: ``kvmesh sim --policies dynamo,...`` runs each
through the real router's index and loop, as it runs kvmesh's own policies, and the verdict
(docs/benchmarks/routing-against-peers.md) reads their runs. None is a router policy: ``router.policy`` names only
``router/routing/policies/``'s registry, and naming a rival there is an error that says where it lives.

One file per rival, one line here per rival (``RIVALS``); ``COMPARED`` is what ``kvmesh sim`` may run.
"""

from __future__ import annotations

from kvmesh.cluster.measure.sim.rivals.dynamo import DynamoPolicy
from kvmesh.cluster.measure.sim.rivals.llmd import LlmdPolicy
from kvmesh.cluster.measure.sim.rivals.llmd_precise import LlmdPrecisePolicy
from kvmesh.cluster.measure.sim.rivals.sglang import SglangPolicy
from kvmesh.router.routing.policies import POLICIES, Policy

RIVALS: dict[str, type[Policy]] = {
    "dynamo": DynamoPolicy,
    "llmd": LlmdPolicy,
    "llmd_precise": LlmdPrecisePolicy,
    "sglang": SglangPolicy,
}
"""The rivals' formulas by name; ``kvmesh sim`` runs them only when ``--policies`` names them."""
COMPARED: dict[str, type[Policy]] = {**POLICIES, **RIVALS}
"""Every policy ``kvmesh sim`` may run: the router's own, then the rivals."""

__all__ = ["COMPARED", "RIVALS"]
