"""What the index knows of a prompt, per tier: the leading blocks each replica holds in its GPU pool and in its
host-memory tier (``PrefixIndex.match_tiers``), handed whole to every routing policy.

A policy that prices tiers (cache_aware) reads both; the others read ``device`` alone. ``host`` is empty until a
replica announces a host tier (events with vLLM's ``medium="CPU"``), so without tiers every policy decides from
the device matches alone.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from kvmesh.router.replicas.replica import ReplicaId

Matches = Mapping[ReplicaId, int]
"""Replica id -> leading blocks of the prompt it holds (replicas holding nothing may be absent)."""


@dataclass(frozen=True, slots=True)
class TierMatches:
    """A prompt's matches per tier."""

    device: Matches = field(default_factory=dict)
    """Replica id -> leading blocks of the prompt in its GPU pool (predictions included)."""
    host: Matches = field(default_factory=dict)
    """Replica id -> leading blocks of the prompt in its host-memory tier; empty without tiers."""
    pullable: Matches | None = None
    """``device`` without predictions: the blocks events confirmed, what a peer pull can move now (a block credited
    to a replica for a request still queued there is not there yet); None: not matched for the policy (the router
    asks when its policy prices pulls, ``Policy.prices_pulls``, and otherwise cuts the holders' matches when it plans
    a pull)."""

    def without(self, replica_ids: Collection[ReplicaId]) -> TierMatches:
        """The same matches less those of ``replica_ids`` (degraded replicas: routed by load only)."""
        if not replica_ids:
            return self
        return TierMatches({r: m for r, m in self.device.items() if r not in replica_ids},
                           {r: m for r, m in self.host.items() if r not in replica_ids},
                           None if self.pullable is None else
                           {r: m for r, m in self.pullable.items() if r not in replica_ids})

    def either(self) -> dict[ReplicaId, int]:
        """Per replica, the leading blocks it holds in either tier (a host-tier block past the device prefix is a
        hit too, loaded back)."""
        if not self.host:
            return dict(self.device)
        out = {r: max(m, self.host.get(r, 0)) for r, m in self.device.items()}
        out.update((r, m) for r, m in self.host.items() if r not in self.device)
        return out
