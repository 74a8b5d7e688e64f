"""``least_loaded``: the replica with the least queued prefill plus weighted decode load (a baseline)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvmesh.router.replicas.replica import Replica
from kvmesh.router.routing.candidates import Candidates
from kvmesh.router.routing.policies.base import Policy, PolicyConfig
from kvmesh.router.routing.policies.no_replica import check_candidates
from kvmesh.router.routing.tier_matches import TierMatches


@dataclass(frozen=True, slots=True)
class LeastLoadedConfig(PolicyConfig):
    """The knob of ``least_loaded``."""

    decode_weight: float = 8.0
    """Prefill tokens one running request is worth."""

    def __post_init__(self) -> None:
        if not self.decode_weight >= 0:
            raise ValueError(f"decode_weight must be >= 0, got {self.decode_weight}")


class LeastLoadedPolicy(Policy):
    name = "least_loaded"
    config_type = LeastLoadedConfig
    config: LeastLoadedConfig

    def choose(self, request_keys: Sequence[int], tiers: TierMatches, candidates: Candidates,
               num_prompt_tokens: int | None = None, lora_name: str | None = None) -> Replica:
        check_candidates(candidates)
        w = self.config.decode_weight
        return min(candidates, key=lambda r: r.load.prefill_backlog + w * r.load.decode_load)
