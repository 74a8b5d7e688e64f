"""Each policy's knobs are one typed section: the options a user writes are checked once, at the edge,
with an error that names the knob; the policy gets the section whole."""

from __future__ import annotations

import math

import pytest
from kvmesh.router.config import RouterConfig
from kvmesh.router.routing.policies import get_policy, policy_config
from kvmesh.router.routing.policies.cache_aware import CacheAwareConfig
from kvmesh.router.routing.policies.cache_aware_tokens import CacheAwareTokensConfig
from kvmesh.router.routing.policies.least_loaded import LeastLoadedConfig
from kvmesh.router.routing.policies.prefix_hash import PrefixHashConfig


def test_options_become_the_policys_typed_section():
    assert policy_config("cache_aware", {"temperature": 0.5, "decode_step_tokens": "inf"}) == CacheAwareConfig(
        temperature=0.5, decode_step_tokens=math.inf)
    assert policy_config("cache_aware_tokens", {"decode_weight": 4}) == CacheAwareTokensConfig(decode_weight=4.0)
    assert policy_config("prefix_hash", {"prefix_blocks": 2}) == PrefixHashConfig(prefix_blocks=2)
    assert get_policy("least_loaded", {"decode_weight": 2}).config == LeastLoadedConfig(decode_weight=2.0)


@pytest.mark.parametrize("policy, options, fragment", [
    ("cache_aware_tokens", {"decode_wieght": 1}, r"'decode_wieght' is not an option of policy 'cache_aware_tokens' "
                                                 r"\(did you mean 'decode_weight'\?\)"),
    ("cache_aware", {"decode_weight": 1}, r"'decode_weight' is not an option of policy 'cache_aware'"),
    ("cache_aware", {"temperature": -1}, "temperature must be >= 0 seconds, got -1"),
    ("round_robin", {"decode_weight": 1}, "'decode_weight' is not an option of policy 'round_robin'.*options: none"),
    ("cache_aware_tokens", {"decode_weight": "heavy"}, "decode_weight='heavy': expected `float`, got `str`"),
    ("prefix_hash", {"prefix_blocks": 1.5}, "prefix_blocks=1.5: expected `int`"),
    ("cache_aware_tokens", {"churn_clamp": 0.5}, "churn_clamp must be >= 1, got 0.5"),
    ("least_loaded", {"decode_weight": -1}, "decode_weight must be >= 0, got -1"),
])
def test_a_bad_knob_is_an_error_that_names_it(policy, options, fragment):
    with pytest.raises(ValueError, match=fragment):
        policy_config(policy, options)


def test_router_config_checks_its_policy_options_when_built():
    with pytest.raises(ValueError, match="backlog_weight must be >= 0"):
        RouterConfig(policy="cache_aware_tokens", policy_kwargs={"backlog_weight": -0.5})
    assert RouterConfig(policy="prefix_hash", policy_kwargs={"virtual_nodes": 8}).policy_config() == PrefixHashConfig(
        virtual_nodes=8)


def test_knobs_of_other_policies_are_dropped_only_when_asked():
    options = {"decode_weight": 2, "prefix_blocks": 3}
    assert policy_config("prefix_hash", options, drop_unknown=True) == PrefixHashConfig(prefix_blocks=3)
    with pytest.raises(ValueError, match="'decode_weight' is not an option of policy 'prefix_hash'"):
        policy_config("prefix_hash", options)


def test_a_policy_refuses_another_policys_section():
    with pytest.raises(TypeError, match="policy 'cache_aware' takes a CacheAwareConfig, got PrefixHashConfig"):
        get_policy("cache_aware", PrefixHashConfig())


def test_the_simulator_refuses_a_knob_no_policy_takes():
    from kvmesh.cluster.measure.sim.config import SimConfig

    SimConfig(policy_kwargs={"decode_weight": 2, "prefix_blocks": 3})  # each tunes one of the policies compared
    with pytest.raises(ValueError, match="'prefix_blokcs' is an option of no routing policy"):
        SimConfig(policy_kwargs={"prefix_blokcs": 3})
