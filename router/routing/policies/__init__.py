"""Routing policies behind a registry: one file per policy, one line here per policy."""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Mapping

import msgspec
from kvmesh.router.routing.policies.base import Choice, Policy, PolicyConfig, PolicyOptions
from kvmesh.router.routing.policies.cache_aware import CacheAwarePolicy, with_step_budget
from kvmesh.router.routing.policies.cache_aware_tokens import CacheAwareTokensPolicy
from kvmesh.router.routing.policies.least_loaded import LeastLoadedPolicy
from kvmesh.router.routing.policies.no_replica import NoReplicaError
from kvmesh.router.routing.policies.prefix_hash import PrefixHashPolicy
from kvmesh.router.routing.policies.random_policy import RandomPolicy
from kvmesh.router.routing.policies.round_robin import RoundRobinPolicy

POLICIES: dict[str, type[Policy]] = {
    "cache_aware": CacheAwarePolicy,
    "round_robin": RoundRobinPolicy,
    "least_loaded": LeastLoadedPolicy,
    "random": RandomPolicy,
    "prefix_hash": PrefixHashPolicy,
    "cache_aware_tokens": CacheAwareTokensPolicy,
}
"""The router's policies by name (``router.policy``): a new policy is one file here and one line in this dict."""
RIVAL_NAMES = frozenset({"dynamo", "llmd", "llmd_precise", "sglang"})
"""The names of the other systems' routing formulas: compared by ``kvmesh sim`` (cluster/measure/sim/rivals/), never
a router policy; named as one, the error says so."""
DEFAULT_POLICY = "cache_aware_tokens"
"""The token cost: on the Mooncake trace it keeps 98.6% of the single pool's hit rate with the lowest TTFT p50 and p99
of every policy (BENCHMARKS.md, the policy matrix); ``cache_aware``'s cost in seconds keeps 90%."""


Registry = Mapping[str, type[Policy]]
"""Policy name -> class: ``POLICIES`` for the router; the simulator passes its own (with the rivals)."""


def policy_class(name: str, registry: Registry = POLICIES) -> type[Policy]:
    """The registered policy ``name`` (with a did-you-mean otherwise; a rival's name says where rivals run)."""
    cls = registry.get(name)
    if cls is None:
        if name in RIVAL_NAMES:
            raise ValueError(f"policy {name!r} is another system's routing formula, compared in the simulator "
                             f"(kvmesh sim --policies {name}), not a router policy; choose one of "
                             f"{', '.join(registry)}")
        raise ValueError(f"unknown policy {name!r}{_did_you_mean(name, list(registry))}; "
                         f"choose one of {', '.join(registry)}")
    return cls


def policy_options(name: str, registry: Registry = POLICIES) -> list[str]:
    """The knobs policy ``name`` takes (its ``PolicyConfig``'s fields)."""
    return [f.name for f in dataclasses.fields(policy_class(name, registry).config_type)]


def policy_config(name: str, options: PolicyOptions | None = None, drop_unknown: bool = False,
                  registry: Registry = POLICIES) -> PolicyConfig:
    """A user's options of policy ``name`` (``router.policy_kwargs``) -> its typed config section.

    A knob the policy does not take, a value of the wrong type or out of range is a ``ValueError`` that names
    the knob; ``drop_unknown`` leaves out the knobs it does not take instead (one ``--policy-kwargs`` for the
    several policies the simulator compares)."""
    known = policy_options(name, registry)
    given = dict(options or {})
    for key in list(given):
        if key in known:
            continue
        if drop_unknown:
            del given[key]
            continue
        raise ValueError(f"policy_kwargs: {key!r} is not an option of policy {name!r}"
                         f"{_did_you_mean(key, known)}; its options: {', '.join(known) or 'none'}")
    try:
        return msgspec.convert(given, policy_class(name, registry).config_type, strict=False)
    except msgspec.ValidationError as e:
        raise ValueError(f"policy_kwargs of policy {name!r}: {_explain(str(e), given)}") from None


def get_policy(name: str = DEFAULT_POLICY, options: PolicyConfig | PolicyOptions | None = None,
               block_size: int = 16, seed: int | None = None, registry: Registry = POLICIES) -> Policy:
    """A new policy by name with its config section (or the options to build it from, ``policy_config``)."""
    config = options if isinstance(options, PolicyConfig) else policy_config(name, options, registry=registry)
    return policy_class(name, registry)(config, block_size=block_size, seed=seed)


def _explain(message: str, given: PolicyOptions) -> str:
    """msgspec's "Expected `float`, got `str` - at `$.decode_weight`" -> "decode_weight='x': expected `float`"."""
    m = re.fullmatch(r"(.*?) - at `\$\.(\w+)`", message, flags=re.S)
    if m is None:
        return message
    text, key = m.groups()
    return f"{key}={given.get(key)!r}: {text[0].lower() + text[1:]}"


def _did_you_mean(key: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


__all__ = ["DEFAULT_POLICY", "POLICIES", "RIVAL_NAMES", "Choice", "NoReplicaError", "Policy", "PolicyConfig",
           "PolicyOptions", "Registry", "get_policy", "policy_class", "policy_config", "policy_options",
           "with_step_budget"]
