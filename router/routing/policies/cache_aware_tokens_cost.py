"""The cost of ``cache_aware_tokens`` (policies/cache_aware_tokens.py, whose module doc gives the formula): every
candidate priced in prefill-token units, or in seconds when tiers or adapters are priced. The terms: the uncached
tokens at the replica's turnover, its queued prefill at the backlog weight, its running requests through the steps
until the first token; with pulls or ghosts, the stored tokens of cost/stored_tokens.py instead of the uncached.

A candidate is its record: its load and measured rates are ``replica.load``. The costs are named by the records'
ids (for metrics and tests); the policy's own walk (``choose``) inlines the same arithmetic.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter

from kvmesh.kvcache.reuse import reusable_blocks
from kvmesh.router.replicas.load import ReplicaLoad
from kvmesh.router.routing.candidates import Candidates
from kvmesh.router.routing.cost import FleetRates, TTFTEstimate
from kvmesh.router.routing.cost.estimate import adapter_s
from kvmesh.router.routing.cost.stored_tokens import pulls_possible, stored_tokens
from kvmesh.router.routing.policies.base import Policy
from kvmesh.router.routing.policies.cache_aware_tokens_config import CacheAwareTokensConfig
from kvmesh.router.routing.queue_tail import QueueTail
from kvmesh.router.routing.tier_matches import Matches

_RECENT_PREFILL = attrgetter("load.recent_prefill")
_EVICTING = attrgetter("load.evicting")


def _has_work(replica) -> bool:
    """Whether a candidate has requests queued or running."""
    return bool(replica.load.prefill_backlog or replica.load.decode_load)


class TokensCost(Policy):
    """The cost terms of ``cache_aware_tokens`` over its candidates."""

    config: CacheAwareTokensConfig

    def __init__(self, config: CacheAwareTokensConfig | None = None, block_size: int = 16,
                 seed: int | None = None) -> None:
        super().__init__(config, block_size, seed)
        c = self.config
        self.tail = None if c.tail_knee is None else QueueTail(c.tail_knee, c.tail_quantile, c.tail_window,
                                                                 c.tail_overload)
        """The queue's tail this router measured, lifting the load weight (``tail_knee``; None: off)."""

    def costs(self, request_keys: Sequence[int], matches: Matches, candidates: Candidates,
              num_prompt_tokens: int | None = None, pullable: Matches | None = None) -> dict[str, float]:
        """Cost of every candidate, by its id (for metrics and tests; ``pullable``: ``TierMatches.pullable``)."""
        prompt = num_prompt_tokens if num_prompt_tokens is not None else len(request_keys) * self.block_size
        bs, w, get = self.block_size, self.config.decode_weight, matches.get
        churn, wb = self._churn_factor(candidates), self._backlog_weight(candidates)
        busy = self._busy(candidates, matches)
        if self._prices_stored(candidates):
            return self._stored_costs(prompt, matches, candidates, churn, wb, busy, pullable)
        out = {}
        for replica in candidates:
            load = replica.load
            uncached: float = prompt - bs * get(replica.id, 0)
            uncached = uncached if uncached > 0 else 0
            backlog = load.prefill_backlog
            steps = self._steps(backlog + uncached)
            if churn:
                uncached *= self._turnover(churn * load.recent_prefill, max(load.evicting, busy))
            out[replica.id] = uncached + self._backlog_cost(backlog, wb) + w * steps * load.decode_load
        return self._with_queue_share(out, prompt, candidates)

    def _queue_span(self, candidates: Candidates, prompt: int) -> tuple[float, float]:
        """``queue_share_weight``'s scale: the fewest requests queued or running on a candidate, and what each request
        more costs (``queue_share_weight * prompt`` over the spread to the most; 0: off, or every candidate alike)."""
        qw = self.config.queue_share_weight
        if not qw:
            return 0.0, 0.0
        counts = [r.load.decode_load for r in candidates]
        low, high = min(counts), max(counts)
        return (low, qw * prompt / (high - low)) if high > low else (0.0, 0.0)

    def _overflow(self, load: ReplicaLoad) -> float:
        """How far a replica's requests overflow its KV cache, in [0, 1] (``queue_share_overflow``; 1 without it)."""
        if not self.config.queue_share_overflow:
            return 1.0
        over = load.decode_load * load.prompt_per_kv_block / self.block_size - 1
        return 0.0 if over < 0 else 1.0 if over > 1 else over

    def _with_queue_share(self, costs: dict[str, float], prompt: int, candidates: Candidates) -> dict[str, float]:
        """``costs`` with each candidate's ``queue_share_weight`` term added."""
        low, per_request = self._queue_span(candidates, prompt)
        if per_request:
            for replica in candidates:
                load = replica.load
                costs[replica.id] += per_request * (load.decode_load - low) * self._overflow(load)
        return costs

    def _plans_pulls(self) -> bool:
        """Pulls are priced and the router plans them (``use_pulls``)."""
        return self.config.price_pulls and self.pulls is not None and self.pulls.enabled

    def _ghost_weight(self, pulls_priced: bool) -> float:
        """``ghost_weight``, or where unset 1 when this decision prices pulls (the copy a pull makes) and 0 else."""
        g = self.config.ghost_weight
        return g if g is not None else 1.0 if pulls_priced else 0.0

    def _prices_stored(self, candidates: Candidates) -> bool:
        """Eviction damage or pulls are priced for these candidates (``_stored_costs``)."""
        if self.config.price_pulls and pulls_possible(self.pulls, candidates.loads):
            return True
        return bool(self._ghost_weight(False) and any(r.load.comeback for r in candidates))

    def _stored_costs(self, prompt: int, matches: Matches, candidates: Candidates, churn: float, wb: float,
                      busy: float, pullable: Matches | None = None) -> dict[str, float]:
        """``costs`` with the new tokens priced by cost/stored_tokens.py: pulled ones at the pull's share, plus the
        eviction damage of storing them, and the computed ones once more per pull landing on the candidate."""
        c = self.config
        pulls = self.pulls if c.price_pulls and pulls_possible(self.pulls, candidates.loads) else None
        stored = stored_tokens(prompt, matches, candidates.loads, self.block_size, pulls,
                               self._ghost_weight(pulls is not None), pullable)
        out = {}
        for replica in candidates:
            load = replica.load
            s, backlog = stored[replica.id], load.prefill_backlog
            steps = self._steps(backlog + s.computed)
            price = s.price * self._turnover(churn * load.recent_prefill, max(load.evicting, busy)) \
                if churn and s.price else s.price
            cost = price + s.damage + self._backlog_cost(backlog, wb) + c.decode_weight * steps * load.decode_load
            if load.landing_pulls:  # computed ahead of each pull landing there: it waits through them
                cost += load.landing_pulls * s.computed
            out[replica.id] = cost
        return self._with_queue_share(out, prompt, candidates)

    def _steps(self, prefill_tokens: float) -> float:
        """Engine steps until ``prefill_tokens`` (queued + this request's uncached) are computed, >= 1."""
        steps = prefill_tokens / self.config.decode_step_tokens
        return steps if steps > 1 else 1.0

    def _backlog_cost(self, backlog: float, wb: float) -> float:
        """Queued prefill at weight ``wb`` (``_backlog_weight``), in full past ``backlog_release_tokens``."""
        release = self.config.backlog_release_tokens
        return wb * backlog + ((1 - wb) * (backlog - release) if backlog > release else 0.0)

    def _backlog_weight(self, candidates: Candidates) -> float:
        """``backlog_weight`` on an evicting fleet, ``filling_backlog_weight`` on a filling one, in between by the
        candidates' mean ``evicting``; with ``tail_knee``, lifted towards ``tail_weight`` as far as the queue's tail
        says (router/routing/queue_tail.py)."""
        c = self.config
        fill, wb = c.filling_backlog_weight, c.backlog_weight
        if fill is not None and fill != wb:
            wb += (fill - wb) * (1 - sum(map(_EVICTING, candidates)) / len(candidates))
        return wb if self.tail is None else self.tail.weight(wb, c.tail_weight)

    def observe_ttft(self, estimate: TTFTEstimate | None, actual_s: float, target_s: float) -> None:
        if self.tail is not None:
            self.tail.observe(estimate, actual_s, target_s)

    def _busy(self, candidates: Candidates, matches: Matches) -> float:
        """How far turnover counts on a replica not evicting. With ``turnover_while_filling``: 1 while any candidate
        has requests queued or running, or where no candidate holds a block of the prompt (``matches``), or with
        ``idle_turnover``; else 0. Without it, with ``busy_turnover``, the share of candidates with requests queued or
        running (0: off)."""
        c = self.config
        if c.turnover_while_filling:
            return 1.0 if c.idle_turnover or not any(matches.values()) or any(map(_has_work, candidates)) else 0.0
        if not c.busy_turnover:
            return 0.0
        return sum(map(_has_work, candidates)) / len(candidates)

    def _churn_factor(self, candidates: Candidates) -> float:
        """``1 / mean recent_prefill`` over the candidates (0: no churn term)."""
        if not self.config.churn_weight:
            return 0.0
        total = sum(map(_RECENT_PREFILL, candidates))
        return len(candidates) / total if total > 0 else 0.0

    def _turnover(self, ratio: float, evicting: float) -> float:
        """What one uncached token costs on a replica at ``ratio`` of the mean intake, ``evicting`` as it is."""
        clamp = self.config.churn_clamp
        ratio = clamp if ratio > clamp else 1 / clamp if ratio * clamp < 1 else ratio
        return 1 + self.config.churn_weight * evicting * (ratio - 1)

    def ttft_s(self, request_keys: Sequence[int], matches: Matches, host_matches: Matches, candidates: Candidates,
               num_prompt_tokens: int | None = None, lora_name: str | None = None,
               pullable: Matches | None = None) -> dict[str, float]:
        """Estimated seconds to first token on every candidate, by its id ("Tiers, in seconds" in
        policies/cache_aware_tokens.py), with the load of ``lora_name`` where it is not resident
        (``cost.estimate.adapter_s``)."""
        prompt = num_prompt_tokens if num_prompt_tokens is not None else len(request_keys) * self.block_size
        usable = reusable_blocks(prompt, self.block_size)  # an engine computes at least the last token
        device, host = matches.get, host_matches.get
        extra = {r.id: max(0, min(host(r.id, 0), usable) - device(r.id, 0)) for r in candidates}
        either = {rid: device(rid, 0) + blocks for rid, blocks in extra.items()}
        costs = self.costs(request_keys, either, candidates, prompt, pullable)
        rates = [r.load.prefill_tokens_per_s for r in candidates if r.load.prefill_tokens_per_s]
        mean_rate = sum(rates) / len(rates) if rates else None
        if mean_rate is None:
            return costs
        fleet = FleetRates.of([r.load for r in candidates]) if lora_name is not None else None
        return {r.id: costs[r.id] / (r.load.prefill_tokens_per_s or mean_rate) + r.load.load_back_s(extra[r.id])
                + (adapter_s(r.load, fleet, lora_name) if fleet is not None else 0.0)
                for r in candidates}
