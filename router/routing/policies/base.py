"""The routing policy interface: pure (no I/O), fast, called once per request.

``decide(request_keys, tiers, candidates, num_prompt_tokens=None, lora_name=None, pinned=None) -> Choice``: the
replica and the request's estimate there (``KVRouter.route`` calls it once per request); ``choose`` is the replica
alone. A policy is handed the replicas themselves and answers with one of them.

- ``request_keys``: the request's router keys (one per full prompt block, router/routing/keys.py).
- ``tiers``: the leading blocks of the prompt each replica holds, per tier (``PrefixIndex.match_tiers``,
  router/routing/tier_matches.py): ``tiers.device`` in its GPU pool, ``tiers.host`` in its host-memory tier
  (empty until a replica announces one), read for a candidate ``r`` as ``tiers.device.get(r.id, 0)``; replicas
  holding nothing may be absent. Policies that do not price tiers read ``tiers.device`` alone (or nothing).
- ``candidates``: the replicas the request may go to (healthy ones; router/routing/candidates.py), their records
  in the router's order: a policy reads a candidate's load and measured rates from ``replica.load``
  (``ReplicaLoad``, router/replicas/load.py) and prices them all through ``candidates.loads`` (router/routing/cost/).
- ``num_prompt_tokens``: the prompt length; defaults to ``len(request_keys) * block_size``.
- ``lora_name``: the LoRA adapter the request names (None: the base model); ``cache_aware`` prices its load.

``keeps_session(pinned, choice, keys, tiers, candidates, ...)`` decides whether a session's pin (``decide``'s
``pinned``, a candidate) overrides the policy's choice.

A policy's tuning knobs are one frozen dataclass, its ``config_type`` (``CacheAwareConfig``, as
sgl-router's), checked when it is built; ``policies.policy_config`` builds it from the options a user
wrote (``router.policy_kwargs``) with an error that names a bad knob.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from kvmesh.router.replicas.replica import Replica
from kvmesh.router.replicas.replica_set import ReplicaSet
from kvmesh.router.routing.candidates import Candidates
from kvmesh.router.routing.cost import Prices, PullPriors, TTFTEstimate, price_all, price_one
from kvmesh.router.routing.tier_matches import TierMatches

PolicyOptions = dict[str, int | float | str | bool]
"""A policy's knobs as a user writes them (``router.policy_kwargs``, ``--policy-kwargs K=V``), before
``policies.policy_config`` checks and converts them to its ``PolicyConfig``."""


DEFAULT_DECODE_STEP_TOKENS = 8192.0
"""vLLM's ``max_num_batched_tokens`` for online serving on 80 GB GPUs: a step budget when the replicas' is unknown."""


@dataclass(frozen=True, slots=True)
class Choice:
    """A policy's answer for one request: where it goes and what it is predicted to cost there."""

    replica: Replica
    """The chosen candidate (one of the records the policy was given)."""
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


    def observe_ttft(self, estimate: TTFTEstimate | None, actual_s: float, target_s: float) -> None:
        """A request this policy chose a replica for, priced there as ``estimate``, had its first token ``actual_s``
        after routing against a target of ``target_s`` (``KVRouter.observe_ttft``). A policy that learns from what
        the fleet measures overrides it; the others learn nothing."""

    def price(self, request_keys: Sequence[int], tiers: TierMatches, candidates: Candidates,
              num_prompt_tokens: int | None = None, lora_name: str | None = None) -> Prices:
        """Every candidate's predicted time for the request, in seconds (router/routing/cost/: the one price)."""
        prompt = num_prompt_tokens if num_prompt_tokens is not None else len(request_keys) * self.block_size
        return price_all(candidates.loads, tiers.device, tiers.host, prompt, self.block_size, self.step_tokens,
                         self.pulls, lora_name)

    def decide(self, request_keys: Sequence[int], tiers: TierMatches, candidates: Candidates,
               num_prompt_tokens: int | None = None, lora_name: str | None = None,
               pinned: Replica | None = None) -> Choice:
        """The chosen candidate with the request's estimate there: the policy's pick, or ``pinned`` (the replica of
        the request's session, a candidate) while ``keeps_session`` keeps it. A policy that does not price chooses,
        then the replica it answers with is priced alone."""
        chosen = self.choose(request_keys, tiers, candidates, num_prompt_tokens, lora_name)
        kept = pinned is not None and pinned is not chosen and self.keeps_session(
            pinned, Choice(chosen, None), request_keys, tiers, candidates, num_prompt_tokens)
        if kept:
            chosen = pinned
        return Choice(chosen, self._priced(chosen, request_keys, tiers, candidates, num_prompt_tokens, lora_name),
                      by_session=kept)

    def _priced(self, candidate: Replica, request_keys: Sequence[int], tiers: TierMatches, candidates: Candidates,
                num_prompt_tokens: int | None, lora_name: str | None) -> TTFTEstimate | None:
        """The request's estimate on ``candidate`` alone (None: not among ``candidates``)."""
        if candidate.id not in candidates.loads:
            return None
        prompt = num_prompt_tokens if num_prompt_tokens is not None else len(request_keys) * self.block_size
        return price_one(candidates.loads, tiers.device, tiers.host, prompt, self.block_size, self.step_tokens,
                         self.pulls, lora_name, candidate.id)

    def choose(self, request_keys: Sequence[int], tiers: TierMatches, candidates: Candidates,
               num_prompt_tokens: int | None = None, lora_name: str | None = None) -> Replica:
        raise NotImplementedError

    def keeps_session(self, pinned: Replica, choice: Choice, request_keys: Sequence[int], tiers: TierMatches,
                      candidates: Candidates, num_prompt_tokens: int | None = None) -> bool:
        """Whether a request of a session pinned to ``pinned`` stays there although the policy made ``choice``
        (router/routing/session.py). Baselines know no cost: the pin always holds."""
        return True
