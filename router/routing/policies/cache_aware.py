"""``cache_aware``: the replica where the request gets its first token soonest, in seconds.

Every candidate is priced by the router's one cost model (router/routing/cost/): the request's predicted time to
first token there -- the prefill queued ahead at the replica's measured prefill rate, the running batch's decode
steps interleaved (its measured decode step time by batch size and context), its own prefill of what that replica
lacks, the host tier's load-back, a peer pull where pulling beats computing, the adapter load where the request
names one that is not resident -- times the replica's learned observed/predicted correction. The cheapest wins;
no weights: each term is seconds the replica measured of itself (or, not measured yet, the slowest another
candidate measured). A cached prefix keeps attracting its requests until the queue there costs more seconds than
the prefill the hit saves.

Exact ties at temperature 0 rotate so an idle cluster is filled evenly; with ``temperature`` > 0 (seconds) the
choice is sampled with probability ``exp(-(ttft - min_ttft) / temperature)``.

``decide`` answers with the prices it chose by (``Choice.prices``): ``KVRouter`` reads the chosen one's into
``RouteDecision.predicted_ttft_s``, and a session's pin is weighed against the same prices.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from kvmesh.router.replicas.replica import Replica
from kvmesh.router.routing.candidates import Candidates
from kvmesh.router.routing.cost import Prices
from kvmesh.router.routing.policies.base import (
    DEFAULT_DECODE_STEP_TOKENS,
    Choice,
    Policy,
    PolicyConfig,
    PolicyOptions,
)
from kvmesh.router.routing.policies.no_replica import check_candidates
from kvmesh.router.routing.tier_matches import TierMatches


@dataclass(frozen=True, slots=True)
class CacheAwareConfig(PolicyConfig):
    """The knobs of ``cache_aware`` (seconds; the cost itself has none)."""

    temperature: float = 0.0
    """Softness of the choice in seconds of predicted TTFT; 0 picks the cheapest replica."""
    session_slack_s: float = 0.0
    """How many seconds more a session's replica may be predicted to take than the cheapest one before the session
    is released to the cheapest. 0: the pin holds while its replica is among the cheapest."""
    decode_step_tokens: float = DEFAULT_DECODE_STEP_TOKENS
    """Prompt tokens one engine step computes (the replicas' ``max_num_batched_tokens``: ``with_step_budget``):
    a request waits through (queued + its own prompt tokens) / this decode steps of the running batch."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "decode_step_tokens", float(self.decode_step_tokens))
        for name, value in (("temperature", self.temperature), ("session_slack_s", self.session_slack_s)):
            if not value >= 0:
                raise ValueError(f"{name} must be >= 0 seconds, got {value}")
        if not self.decode_step_tokens > 0:
            raise ValueError(f"decode_step_tokens must be > 0, got {self.decode_step_tokens}")


def with_step_budget(policy: str, options: PolicyOptions, max_num_batched_tokens: int) -> PolicyOptions:
    """``cache_aware`` (and ``cache_aware_tokens``) count the steps a request waits through: give them the replicas'
    step budget (``max_num_batched_tokens``) as ``decode_step_tokens`` unless the options set one (serve, the sim)."""
    if policy not in (CacheAwarePolicy.name, "cache_aware_tokens") or "decode_step_tokens" in options:
        return options
    return {**options, "decode_step_tokens": max_num_batched_tokens}


class CacheAwarePolicy(Policy):
    name = "cache_aware"
    config_type = CacheAwareConfig
    config: CacheAwareConfig

    def __init__(self, config: CacheAwareConfig | None = None, block_size: int = 16,
                 seed: int | None = None) -> None:
        super().__init__(config, block_size, seed)
        self._tie = 0
        self.step_tokens = self.config.decode_step_tokens

    def choose(self, request_keys: Sequence[int], tiers: TierMatches, candidates: Candidates,
               num_prompt_tokens: int | None = None, lora_name: str | None = None) -> Replica:
        return self.decide(request_keys, tiers, candidates, num_prompt_tokens, lora_name).replica

    def decide(self, request_keys: Sequence[int], tiers: TierMatches, candidates: Candidates,
               num_prompt_tokens: int | None = None, lora_name: str | None = None,
               pinned: Replica | None = None) -> Choice:
        check_candidates(candidates)
        prices = self.price(request_keys, tiers, candidates, num_prompt_tokens, lora_name)
        chosen = self._cheapest(prices, candidates)
        kept = pinned is not None and pinned is not chosen and self.keeps_session(
            pinned, Choice(chosen, None, prices), request_keys, tiers, candidates, num_prompt_tokens)
        if kept:
            chosen = pinned
        return Choice(chosen, prices[chosen.id], prices, by_session=kept)

    def _cheapest(self, prices: Prices, candidates: Candidates) -> Replica:
        """The candidate priced soonest (``prices`` names each by its record's id)."""
        choice, ids = prices.choice, prices.ids  # per row, candidates in order (cost/prices.py)
        best = float(choice.min())
        t = self.config.temperature
        if t > 0:
            rows = prices.rows
            weights = [math.exp((best - cost) / t) for cost in choice[rows].tolist()]
            row = self.rng.choices(rows.tolist(), weights)[0]
        else:
            ties = np.flatnonzero(choice <= best * (1 + 1e-9))
            if len(ties) > 1:  # as soon, then the least work: a burst sharing a new prefix waits for its holder
                own = prices.own_tokens[ties]
                ties = ties[own == own.min()]
            if len(ties) > 1:
                self._tie += 1
            row = ties[self._tie % len(ties)] if len(ties) > 1 else ties[0]
        chosen = candidates.named(ids[row])
        assert chosen is not None  # prices are the candidates'
        return chosen

    def keeps_session(self, pinned: Replica, choice: Choice, request_keys: Sequence[int], tiers: TierMatches,
                      candidates: Candidates, num_prompt_tokens: int | None = None) -> bool:
        chosen, prices = choice.replica, choice.prices
        if prices is None or pinned.id not in prices or chosen.id not in prices:
            prices = self.price(request_keys, TierMatches(tiers.device), candidates.only(pinned, chosen),
                                num_prompt_tokens)
        return prices[pinned.id].choice_s <= prices[chosen.id].choice_s + self.config.session_slack_s
