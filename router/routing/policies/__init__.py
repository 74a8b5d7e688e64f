"""Routing policies behind a registry: one file per policy, one line here per policy."""

from __future__ import annotations

import dataclasses
import difflib
import re

import msgspec
from kvmesh.router.routing.policies.base import Choice, Policy, PolicyConfig, PolicyOptions
from kvmesh.router.routing.policies.cache_aware import CacheAwarePolicy, with_step_budget
from kvmesh.router.routing.policies.cache_aware_tokens import CacheAwareTokensPolicy
from kvmesh.router.routing.policies.dynamo import DynamoPolicy
from kvmesh.router.routing.policies.least_loaded import LeastLoadedPolicy
from kvmesh.router.routing.policies.llmd import LlmdPolicy
from kvmesh.router.routing.policies.llmd_precise import LlmdPrecisePolicy
from kvmesh.router.routing.policies.no_replica import NoReplicaError
from kvmesh.router.routing.policies.prefix_hash import PrefixHashPolicy
from kvmesh.router.routing.policies.random_policy import RandomPolicy
from kvmesh.router.routing.policies.round_robin import RoundRobinPolicy
from kvmesh.router.routing.policies.sglang import SglangPolicy

POLICIES: dict[str, type[Policy]] = {
    "cache_aware": CacheAwarePolicy,
    "round_robin": RoundRobinPolicy,
    "least_loaded": LeastLoadedPolicy,
    "random": RandomPolicy,
    "prefix_hash": PrefixHashPolicy,
    "cache_aware_tokens": CacheAwareTokensPolicy,
    "dynamo": DynamoPolicy,
    "llmd": LlmdPolicy,
    "llmd_precise": LlmdPrecisePolicy,
    "sglang": SglangPolicy,
}
PEER_POLICIES = frozenset({"dynamo", "llmd", "llmd_precise", "sglang"})
"""The routing formulas of the systems users would run instead (Dynamo, llm-d, sglang-router / vllm-router), kept
as rivals: selectable, but run by ``kvmesh sim`` only when ``--policies`` names them."""
DEFAULT_POLICY = "cache_aware_tokens"
"""The token cost: on the Mooncake trace it keeps 98.6% of the single pool's hit rate with the lowest TTFT p50 and p99
of every policy (BENCHMARKS.md, the policy matrix); ``cache_aware``'s cost in seconds keeps 90%."""


def policy_class(name: str) -> type[Policy]:
    """The registered policy ``name`` (with a did-you-mean otherwise)."""
    cls = POLICIES.get(name)
    if cls is None:
        raise ValueError(f"unknown policy {name!r}{_did_you_mean(name, list(POLICIES))}; "
                         f"choose one of {', '.join(POLICIES)}")
    return cls


def policy_options(name: str) -> list[str]:
    """The knobs policy ``name`` takes (its ``PolicyConfig``'s fields)."""
    return [f.name for f in dataclasses.fields(policy_class(name).config_type)]


def policy_config(name: str, options: PolicyOptions | None = None, drop_unknown: bool = False) -> PolicyConfig:
    """A user's options of policy ``name`` (``router.policy_kwargs``) -> its typed config section.

    A knob the policy does not take, a value of the wrong type or out of range is a ``ValueError`` that names
    the knob; ``drop_unknown`` leaves out the knobs it does not take instead (one ``--policy-kwargs`` for the
    several policies the simulator compares)."""
    known = policy_options(name)
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
        return msgspec.convert(given, policy_class(name).config_type, strict=False)
    except msgspec.ValidationError as e:
        raise ValueError(f"policy_kwargs of policy {name!r}: {_explain(str(e), given)}") from None


def get_policy(name: str = DEFAULT_POLICY, options: PolicyConfig | PolicyOptions | None = None,
               block_size: int = 16, seed: int | None = None) -> Policy:
    """A new policy by name with its config section (or the options to build it from, ``policy_config``)."""
    config = options if isinstance(options, PolicyConfig) else policy_config(name, options)
    return policy_class(name)(config, block_size=block_size, seed=seed)


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


__all__ = ["DEFAULT_POLICY", "PEER_POLICIES", "POLICIES", "Choice", "NoReplicaError", "Policy", "PolicyConfig",
           "PolicyOptions", "get_policy", "policy_class", "policy_config", "policy_options",
           "with_step_budget"]
