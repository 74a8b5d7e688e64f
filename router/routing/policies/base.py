"""The routing policy interface: pure (no I/O), fast, called once per request.

``decide(request_keys, tiers, loads, num_prompt_tokens=None, lora_name=None, pinned=None) -> Choice``: the
replica and the request's estimate there (``KVRouter.route`` calls it once per request); ``choose`` is the replica
alone.

- ``request_keys``: the request's router keys (one per full prompt block, router/routing/keys.py).
- ``tiers``: the leading blocks of the prompt each replica holds, per tier (``PrefixIndex.match_tiers``,
  router/routing/tier_matches.py): ``tiers.device`` in its GPU pool, ``tiers.host`` in its host-memory tier
  (empty until a replica announces one); replicas holding nothing may be absent, replicas not in ``loads``
  are ignored. Policies that do not price tiers read ``tiers.device`` alone (or nothing).
- ``loads``: the *candidate* replicas (healthy ones), id -> ``ReplicaLoad`` (router/routing/load.py).
- ``num_prompt_tokens``: the prompt length; defaults to ``len(request_keys) * block_size``.
- ``lora_name``: the LoRA adapter the request names (None: the base model); ``cache_aware`` prices its load.

``keeps_session(pinned, choice, keys, matches, ...)`` decides whether a session's pin (``decide``'s ``pinned``)
overrides the policy's choice (``matches``: the device tier's).

A policy's tuning knobs are one frozen dataclass, its ``config_type`` (``CacheAwareConfig``, as
sgl-router's), checked when it is built; ``policies.policy_config`` builds it from the options a user
wrote (``router.policy_kwargs``) with an error that names a bad knob.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from kvmesh.router.replicas.load import ReplicaLoad
from kvmesh.router.replicas.replica import ReplicaId
from kvmesh.router.replicas.replica_set import ReplicaSet
from kvmesh.router.routing.cost import Prices, PullPriors, TTFTEstimate, price_all, price_one
from kvmesh.router.routing.tier_matches import TierMatches

Matches = Mapping[ReplicaId, int]
"""Replica id -> leading blocks of the prompt it holds (one tier's; ``TierMatches`` holds both)."""
Loads = Mapping[ReplicaId, ReplicaLoad]
"""The candidate replicas and what the router knows of their load."""
PolicyOptions = dict[str, int | float | str | bool]
"""A policy's knobs as a user writes them (``router.policy_kwargs``, ``--policy-kwargs K=V``), before
``policies.policy_config`` checks and converts them to its ``PolicyConfig``."""


DEFAULT_DECODE_STEP_TOKENS = 8192.0
"""vLLM's ``max_num_batched_tokens`` for online serving on 80 GB GPUs: a step budget when the replicas' is unknown."""


@dataclass(frozen=True, slots=True)
class Choice:
    """A policy's answer for one request: where it goes and what it is predicted to cost there."""

    replica_id: ReplicaId
    """The chosen candidate (a key of the loads the policy was given)."""
    estimate: TTFTEstimate | None
    """The request's estimate on it (router/routing/cost/); None: not priced (not a candidate)."""
    prices: Prices | None = None
    """Every candidate's estimate, when the policy chose by them (``cache_aware``); None: only the chosen one's."""
    by_session: bool = False
    """A session's pin chose it over the policy's pick (``decide``'s ``pinned``)."""


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """The tuning knobs of a policy; the baselines without knobs take this empty one."""


class Policy:
    """Base class: holds the block size, the random source and the policy's config section."""

    name: ClassVar[str] = "base"
    """The policy's registry name (router.policy)."""
    config_type: ClassVar[type[PolicyConfig]] = PolicyConfig
    """The dataclass of its knobs."""
    scrape_interval_s: ClassVar[float] = 0.0
    """Seconds between the scrapes of every replica's metrics the system it models makes (0: it reads none but
    its own counts); ``kvmesh sim`` polls ``/load`` that often for it unless ``--load-poll-s`` is set."""

    def __init__(self, config: PolicyConfig | None = None, block_size: int = 16, seed: int | None = None) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        if config is None:
            config = self.config_type()
        elif not isinstance(config, self.config_type):
            raise TypeError(f"policy {self.name!r} takes a {self.config_type.__name__}, got {type(config).__name__}")
        self.config = config
        """The policy's knobs."""
        self.block_size = block_size
        """Tokens per block (to turn matched blocks into tokens)."""
        self.rng = random.Random(seed)
        """Random source of sampling policies; seeded for reproducible simulations."""
        self.pulls: PullPriors | None = None
        """Whether and how a candidate may pull a prefix from a peer, for the price (``KVRouter`` sets it from its
        transfers section; None: no pull priced)."""
        self.step_tokens = DEFAULT_DECODE_STEP_TOKENS
        """Prompt tokens one engine step of the replicas computes (their step budget), for the price."""

    @property
    def tracks_evictions(self) -> bool:
        """The policy prices what the replicas evict and whether it comes back (``ReplicaLoad.comeback``): the router
        keeps its ghost list of evicted blocks only then (router/routing/eviction_ghosts.py)."""
        return False

    @property
    def prices_pulls(self) -> bool:
        """The policy prices the peer pulls a candidate would make: the router then matches what a pull can move
        (``TierMatches.pullable``) for it too (the router plans every policy's pulls from those blocks)."""
        return False

    def use_pulls(self, pulls: PullPriors | None) -> None:
        self.pulls = pulls

    def use_replicas(self, replicas: ReplicaSet) -> None:
        """The router's replica set (a policy that keeps a structure over every replica follows its changes;
        ``choose`` still gets the candidates). A policy used without a router is never given one."""


    def price(self, request_keys: Sequence[int], tiers: TierMatches, loads: Loads,
              num_prompt_tokens: int | None = None, lora_name: str | None = None) -> Prices:
        """Every candidate's predicted time for the request, in seconds (router/routing/cost/: the one price)."""
        prompt = num_prompt_tokens if num_prompt_tokens is not None else len(request_keys) * self.block_size
        return price_all(loads, tiers.device, tiers.host, prompt, self.block_size, self.step_tokens, self.pulls,
                         lora_name)

    def decide(self, request_keys: Sequence[int], tiers: TierMatches, loads: Loads,
               num_prompt_tokens: int | None = None, lora_name: str | None = None,
               pinned: ReplicaId | None = None) -> Choice:
        """The chosen candidate with the request's estimate there: the policy's pick, or ``pinned`` (the replica of
        the request's session, a candidate) while ``keeps_session`` keeps it. A policy that does not price chooses,
        then the replica it answers with is priced alone."""
        chosen = self.choose(request_keys, tiers, loads, num_prompt_tokens, lora_name)
        kept = pinned is not None and pinned != chosen and self.keeps_session(
            pinned, Choice(chosen, None), request_keys, tiers.device, loads, num_prompt_tokens)
        if kept:
            chosen = pinned
        return Choice(chosen, self._priced(chosen, request_keys, tiers, loads, num_prompt_tokens, lora_name),
                      by_session=kept)

    def _priced(self, candidate: ReplicaId, request_keys: Sequence[int], tiers: TierMatches, loads: Loads,
                num_prompt_tokens: int | None, lora_name: str | None) -> TTFTEstimate | None:
        """The request's estimate on ``candidate`` alone (None: not among ``loads``)."""
        if candidate not in loads:
            return None
        prompt = num_prompt_tokens if num_prompt_tokens is not None else len(request_keys) * self.block_size
        return price_one(loads, tiers.device, tiers.host, prompt, self.block_size, self.step_tokens, self.pulls,
                         lora_name, candidate)

    def choose(self, request_keys: Sequence[int], tiers: TierMatches, loads: Loads,
               num_prompt_tokens: int | None = None, lora_name: str | None = None) -> ReplicaId:
        raise NotImplementedError

    def keeps_session(self, pinned: ReplicaId, choice: Choice, request_keys: Sequence[int],
                      matches: Matches, loads: Loads, num_prompt_tokens: int | None = None) -> bool:
        """Whether a request of a session pinned to ``pinned`` stays there although the policy made ``choice``
        (router/routing/session.py). Baselines know no cost: the pin always holds."""
        return True
