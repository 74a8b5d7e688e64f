"""The default routing policy keeps what users had: prefix hits first (the token cost, ``cache_aware_tokens``),
and an adapter already resident on a replica counts (its load time, as ``cache_aware`` prices it)."""

from __future__ import annotations

from kvmesh.replica.serving.load_report import LoRALoad
from kvmesh.router.replicas.load import ReplicaLoad
from kvmesh.router.routing.policies import DEFAULT_POLICY, get_policy
from kvmesh.router.routing.tier_matches import TierMatches

from .helpers import candidates

BS = 16
KEYS = list(range(64))  # a 1,024-token prompt


def _replica(resident: list[str], queued: int = 0) -> ReplicaLoad:
    lora = LoRALoad(enabled=True, adapters={"big": 2_000_000_000}, resident=resident, load_bytes_per_s=2e9)
    return ReplicaLoad(prefill_tokens_per_s=10_000.0, queued_prefill_tokens=queued, lora=lora)


def test_the_default_is_the_token_cost():
    assert DEFAULT_POLICY == "cache_aware_tokens"


def test_a_resident_adapter_outweighs_a_short_queue():
    """The adapter's load (1 s at 2 GB/s) costs more than 2,000 queued tokens (0.2 s at 10k tokens/s, weighted)."""
    policy = get_policy(DEFAULT_POLICY, block_size=BS)
    loads = {"resident": _replica(["big"], queued=2_000), "cold": _replica([])}
    assert policy.choose(KEYS, TierMatches({}), candidates(loads), lora_name="big").id == "resident"
    assert policy.choose(KEYS, TierMatches({}), candidates(loads)).id == "cold"  # the base model: the queue decides


def test_an_adapter_nobody_reports_is_not_priced():
    """A hostile or unknown adapter name adds nothing anywhere: the choice is the base model's."""
    policy = get_policy(DEFAULT_POLICY, block_size=BS)
    loads = {"resident": _replica(["big"], queued=2_000), "cold": _replica([])}
    assert policy.choose(KEYS, TierMatches({}), candidates(loads), lora_name="no-such-adapter").id == "cold"


def test_a_prefix_hit_still_wins_with_an_adapter_named():
    policy = get_policy(DEFAULT_POLICY, block_size=BS)
    loads = {"holder": _replica(["big"]), "other": _replica(["big"])}
    assert policy.choose(KEYS, TierMatches({"holder": 60}), candidates(loads), lora_name="big").id == "holder"
