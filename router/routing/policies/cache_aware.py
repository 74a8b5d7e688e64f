"""``cache_aware`` (default): the replica where the request would finish its prefill soonest,
counting what its new blocks will evict.

For each candidate replica ``r``, in prefill-token units::

    cost(r) = uncached(r) * turnover(r)            prompt tokens it would still compute (prompt - cached prefix)
            + backlog_weight * prefill_backlog(r)  prompt tokens queued before ours
            + decode_weight * steps(r) * decode_load(r)   running requests slowing every step

    steps(r) = max(1, (prefill_backlog(r) + uncached(r)) / decode_step_tokens)   steps until our first token

    turnover(r) = 1 + churn_weight * (x - 1),   x = recent_prefill(r) / mean recent_prefill,
                                                  clamped to [1 / churn_clamp, churn_clamp]

The trade-off is continuous, not a threshold: a cached prefix keeps attracting requests until the
replica's backlog outweighs the prefill it saves. ``backlog_weight`` < 1 leans towards reuse:
queued prefill only delays this request, while prefill saved by a hit is compute every later
request gets back (and a burst sharing a new prefix stays on the replica that is computing it).
``turnover`` makes the choice eviction-aware: every uncached token stored on a replica evicts one
from the tail of its LRU, and a replica that takes in new tokens faster than the others has a
younger, likelier-reused tail. Steering new work towards slow-turnover replicas makes the
partitioned caches behave more like one LRU pool (the simulator's attribution: fewer prefixes
evicted from every replica). ``steps`` puts the decode term in time: ``decode_weight`` (8) is about
what one running request with a 15k-token context adds to one step (50 us + 39 ns per context
token ~ 8 prefill tokens at 12k tokens/s, ``cluster/measure/sim/config.py``), and a request behind a long
backlog or with a long uncached prompt waits through several steps; a short prompt still weighs a
running request as 8 tokens. Defaults (0.15, 1.0, 8192) come from ``kvmesh sim`` (BENCHMARKS.md §1.7).
With ``temperature > 0`` the choice is sampled
with probability ``exp(-(cost - min_cost) / temperature)``, spreading load over near-equal
replicas; exact ties at temperature 0 rotate so an idle cluster is filled evenly.
"""

from __future__ import annotations

import math
from operator import attrgetter

from kvmesh.router.routing.policies.base import Policy

_RECENT_PREFILL = attrgetter("recent_prefill")


class CacheAwarePolicy(Policy):
    name = "cache_aware"

    def __init__(self, decode_weight: float = 8.0, backlog_weight: float = 0.15, temperature: float = 0.0,
                 session_slack_tokens: float = 0.0, churn_weight: float = 1.0, churn_clamp: float = 2.0,
                 backlog_release_tokens: float = math.inf, decode_step_tokens: float = 8192,
                 **kwargs) -> None:
        super().__init__(**kwargs)
        if decode_weight < 0 or backlog_weight < 0:
            raise ValueError(f"decode_weight and backlog_weight must be >= 0, got {decode_weight}, {backlog_weight}")
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = always the cheapest), got {temperature}")
        self.decode_weight = decode_weight
        """Prefill tokens one running request on a replica is worth."""
        self.backlog_weight = backlog_weight
        """Weight of the prompt tokens queued on a replica against the ones a cache hit saves."""
        if not backlog_release_tokens >= 0:
            raise ValueError(f"backlog_release_tokens must be >= 0, got {backlog_release_tokens}")
        self.backlog_release_tokens = backlog_release_tokens
        """Queued prefill tokens beyond which the backlog counts in full (weight 1, not
        ``backlog_weight``): past this release point a hot replica sheds requests as a plain
        least-loaded router would, so its prefixes get replicated elsewhere. inf = never."""
        decode_step_tokens = float(decode_step_tokens)
        if not decode_step_tokens > 0:
            raise ValueError(f"decode_step_tokens must be > 0, got {decode_step_tokens}")
        self.decode_step_tokens = decode_step_tokens
        """Prefill tokens one engine step computes (the replicas' ``max_num_batched_tokens``; 8192 is
        vLLM's default for online serving on 80 GB GPUs). A running request slows every step, so it
        costs ``decode_weight`` per step until the new request's prefill is done: (queued +
        uncached prompt tokens) / this, at least 1. inf: always one step (the cost before it)."""
        self.temperature = temperature
        """Softness of the choice in prefill tokens; 0 picks the cheapest replica."""
        if session_slack_tokens < 0:
            raise ValueError(f"session_slack_tokens must be >= 0, got {session_slack_tokens}")
        if churn_weight < 0:
            raise ValueError(f"churn_weight must be >= 0, got {churn_weight}")
        self.churn_weight = churn_weight
        """Eviction awareness: uncached tokens placed on a replica whose cache turns over faster than
        the mean (``recent_prefill``) evict younger, likelier-reused blocks; they cost
        ``1 + churn_weight * (churn / mean churn - 1)`` each instead of 1."""
        if churn_clamp < 1:
            raise ValueError(f"churn_clamp must be >= 1, got {churn_clamp}")
        self.churn_clamp = churn_clamp
        """Bound of the churn ratio (a replica idle so far must not look free: ratio >= 1/clamp)."""
        self.session_slack_tokens = session_slack_tokens
        """How much more (in cost units, prefill tokens) a session's replica may cost than the
        cheapest one before the session is released to the cheapest. 0 (default): the pin holds
        while its replica is among the cheapest; the index already keeps a conversation where its
        history is cached, and in the simulator every slack above 0 cost hit rate and balance
        (it overrides the load and turnover terms: BENCHMARKS.md §1.8)."""
        self._tie = 0

    def costs(self, request_keys, matches, loads, num_prompt_tokens=None) -> dict:
        """Cost of every candidate replica (for metrics and tests)."""
        prompt = num_prompt_tokens if num_prompt_tokens is not None else len(request_keys) * self.block_size
        bs, w, get = self.block_size, self.decode_weight, matches.get
        churn = self._churn_factor(loads)
        out = {}
        for rid, load in loads.items():
            uncached = prompt - bs * get(rid, 0)
            uncached = uncached if uncached > 0 else 0
            backlog = load.prefill_backlog
            steps = self._steps(backlog + uncached)
            if churn:
                uncached *= self._turnover(churn * load.recent_prefill)
            out[rid] = uncached + self._backlog_cost(backlog) + w * steps * load.decode_load
        return out

    def _steps(self, prefill_tokens: float) -> float:
        """Engine steps until ``prefill_tokens`` (queued + this request's uncached) are computed, >= 1."""
        steps = prefill_tokens / self.decode_step_tokens
        return steps if steps > 1 else 1.0

    def _backlog_cost(self, backlog: float) -> float:
        wb, release = self.backlog_weight, self.backlog_release_tokens
        return wb * backlog + ((1 - wb) * (backlog - release) if backlog > release else 0.0)

    def _churn_factor(self, loads) -> float:
        """``1 / mean recent_prefill`` over the candidates (0: no churn term)."""
        if not self.churn_weight:
            return 0.0
        total = sum(map(_RECENT_PREFILL, loads.values()))
        return len(loads) / total if total > 0 else 0.0

    def _turnover(self, ratio: float) -> float:
        clamp = self.churn_clamp
        ratio = clamp if ratio > clamp else 1 / clamp if ratio * clamp < 1 else ratio
        return 1 + self.churn_weight * (ratio - 1)

    def keeps_session(self, pinned, chosen, request_keys, matches, loads, num_prompt_tokens=None) -> bool:
        costs = self.costs(request_keys, matches, {pinned: loads[pinned], chosen: loads[chosen]},
                           num_prompt_tokens)
        return costs[pinned] <= costs[chosen] + self.session_slack_tokens

    def choose(self, request_keys, matches, loads, num_prompt_tokens=None):
        self._check(loads)
        if self.temperature > 0:
            costs = self.costs(request_keys, matches, loads, num_prompt_tokens)
            best, t = min(costs.values()), self.temperature
            weights = [math.exp((best - c) / t) for c in costs.values()]
            return self.rng.choices(list(costs), weights)[0]
        # One pass, fields read directly (this runs once per request over every candidate).
        prompt = num_prompt_tokens if num_prompt_tokens is not None else len(request_keys) * self.block_size
        bs, w, wb, get = self.block_size, self.decode_weight, self.backlog_weight, matches.get
        churn, release = self._churn_factor(loads), self.backlog_release_tokens
        cw, hi = self.churn_weight, self.churn_clamp
        lo, step = 1 / hi, self.decode_step_tokens
        best_cost, ties = math.inf, []
        for rid, load in loads.items():
            cached = get(rid)
            cost = prompt - bs * cached if cached else prompt
            if cost < 0:
                cost = 0
            pending, queued = load.pending_prefill_tokens, load.queued_prefill_tokens
            backlog = pending if pending > queued else queued
            steps = (backlog + cost) / step
            if cost and churn:  # turnover(), inlined: this loop runs over every candidate per request
                x = churn * load.recent_prefill
                cost *= 1 + cw * ((hi if x > hi else lo if x < lo else x) - 1)
            in_flight, reported = load.in_flight, load.num_running + load.num_waiting
            cost += wb * backlog + w * (steps if steps > 1 else 1) * (in_flight if in_flight > reported else reported)
            if backlog > release:
                cost += (1 - wb) * (backlog - release)
            if cost < best_cost:
                best_cost, ties = cost, [rid]
            elif cost == best_cost:
                ties.append(rid)
        if len(ties) == 1:
            return ties[0]
        self._tie += 1
        return ties[self._tie % len(ties)]
