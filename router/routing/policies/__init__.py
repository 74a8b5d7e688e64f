"""Routing policies behind a registry: one file per policy, one line here per policy."""

from __future__ import annotations

from kvmesh.router.routing.policies.base import NoReplicaError, Policy
from kvmesh.router.routing.policies.cache_aware import CacheAwarePolicy
from kvmesh.router.routing.policies.least_loaded import LeastLoadedPolicy
from kvmesh.router.routing.policies.prefix_hash import PrefixHashPolicy
from kvmesh.router.routing.policies.random_policy import RandomPolicy
from kvmesh.router.routing.policies.round_robin import RoundRobinPolicy

POLICIES: dict[str, type[Policy]] = {
    "cache_aware": CacheAwarePolicy,
    "round_robin": RoundRobinPolicy,
    "least_loaded": LeastLoadedPolicy,
    "random": RandomPolicy,
    "prefix_hash": PrefixHashPolicy,
}
DEFAULT_POLICY = "cache_aware"


def get_policy(name: str = DEFAULT_POLICY, **kwargs) -> Policy:
    """A new policy instance by name; kwargs are its options (block_size, seed, decode_weight, ...)."""
    cls = POLICIES.get(name)
    if cls is None:
        raise ValueError(f"unknown routing policy {name!r}; choose one of {sorted(POLICIES)}")
    return cls(**kwargs)


__all__ = ["DEFAULT_POLICY", "POLICIES", "NoReplicaError", "Policy", "get_policy"]
