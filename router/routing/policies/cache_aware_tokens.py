"""``cache_aware_tokens`` (default): the replica where the request would finish its prefill soonest in prefill-token
units with weights tuned in the simulator, counting what its new blocks will evict. ``cache_aware`` prices the choice
in seconds without weights (policies/cache_aware.py); on the Mooncake trace it keeps fewer hits (BENCHMARKS.md).

For each candidate replica ``r``, in prefill-token units::

    cost(r) = uncached(r) * turnover(r)            prompt tokens it would still compute (prompt - cached prefix)
            + backlog_w * prefill_backlog(r)       prompt tokens queued before ours
            + decode_weight * steps(r) * decode_load(r)   running requests slowing every step
            + queue_share_weight * prompt * (decode_load(r) - min) / (max - min) * overflow(r)
                                                   its requests against the others', where they overflow its KV cache

    steps(r) = max(1, (prefill_backlog(r) + uncached(r)) / decode_step_tokens)   steps until our first token

    turnover(r) = 1 + churn_weight * g(r) * (x - 1),   x = recent_prefill(r) / mean recent_prefill,
                                                         clamped to [1 / churn_clamp, churn_clamp]
    g(r)        = max(evicting(r), busy)
    backlog_w   = backlog_weight + (filling_backlog_weight - backlog_weight) * (1 - mean evicting)
                  then, with tail_knee, + (tail_weight - backlog_w) * lift   (lift: the queue's tail, below)

``min`` and ``max``: the fewest and most requests queued or running (``decode_load``) on any candidate (the term is 0
where they are equal, and off by default: ``CacheAwareTokensConfig.queue_share_weight``); ``overflow(r)``:
``decode_load(r)`` times their mean prompt over its KV cache's tokens, minus 1, clamped to [0, 1]
(``queue_share_overflow``).

``evicting(r)``: the share of the blocks ``r`` stored lately that evicted one, from its KV events
(``ReplicaLoad.evicting``, router/routing/evicting.py): 0 while its cache fills, about 1 once full. ``busy``: 1 while
any candidate has requests queued or running or no replica holds a block of the prompt, 0 on an idle fleet for a
prompt some replica holds (``turnover_while_filling``, the default); with it off, the share of candidates with
requests queued or running (``busy_turnover``; 0 when off).

The trade-off is continuous, not a threshold: a cached prefix keeps attracting requests until the
replica's backlog outweighs the prefill it saves. ``backlog_weight`` < 1 leans towards reuse:
queued prefill only delays this request, while prefill saved by a hit is compute every later
request gets back (and a burst sharing a new prefix stays on the replica that is computing it).
``turnover`` makes the choice eviction-aware: every uncached token stored on a replica evicts one
from the tail of its LRU, and a replica that takes in new tokens faster than the others has a
younger, likelier-reused tail. Steering new work towards slow-turnover replicas makes the
partitioned caches behave more like one LRU pool (the simulator's attribution: fewer prefixes
evicted from every replica). A replica not evicting evicts nothing by storing a token; its intake is
priced while the fleet is busy, where spreading it evens the queues: on an idle fleet a
conversation's next turn stays on its holder. ``filling_backlog_weight`` (an option, off) weighs the
queue apart while the fleet fills, when a copy of a prefix costs no later hit. ``tail_knee`` (an option, off) learns
the weight online from the waits this router measures (router/routing/queue_tail.py): ``lift`` goes from 0 while
the recent requests' waits (TTFT less their own predicted prefill, their 90th percentile) stay under ``tail_knee`` x
their TTFT target to 1 as they reach it, so a holder's queue weighs more as it starts to cost requests their target.
``steps`` puts the decode term in time:
``decode_weight`` (8) is about
what one running request with a 15k-token context adds to one step (50 us + 39 ns per context
token ~ 8 prefill tokens at 12k tokens/s, ``cluster/measure/sim/config.py``), and a request behind a long
backlog or with a long uncached prompt waits through several steps; a short prompt still weighs a
running request as 8 tokens. Defaults (0.15, 1.0, 8192) were tuned with ``kvmesh sim`` on the Mooncake trace.
**Tiers, in seconds.** When some replica has a host-memory tier (``tiers.host``), each candidate is
priced as estimated time to first token, from what the replica measured of itself and reports in
``/load``: the cost above (host-tier blocks past its device prefix counted as cached) over its
prefill rate, plus their load-back, ``blocks * block bytes / host-to-device bandwidth``. A device hit
costs nothing, a host hit its copy, a miss its prefill, the queue its prefill. A replica that reports
no prefill rate gets the mean of those that do; with no rate anywhere the costs stay in tokens and a
host hit counts as a device hit (its load-back cannot be priced). A request naming a LoRA adapter that a
candidate reports is priced the same way in seconds, plus the adapter's load where it is not resident (its size
over the measured load rate, as ``cache_aware`` prices it: router/routing/cost/estimate.py).
**Stored tokens** (cost/stored_tokens.py). With peer pulls on (``price_pulls``), the prefix a candidate with no
prefill queued would pull from a peer costs the pull's share of its compute time, and a copy of blocks another
replica holds costs how often evicted blocks come back (``ghost_weight``, 1 there unless set; the ghost lists:
router/routing/eviction_ghosts.py). A candidate a committed pull is still landing on (``ReplicaLoad.landing_pulls``)
costs its computed tokens once more per such pull: the pulled request joins the queue when its transfer ends and
waits through them, a full prefill token each, as the first term prices them. Without pulls none is priced unless
``ghost_weight`` is set. Their verdict: docs/benchmarks/routing-against-peers.md.
**Several routers** (a replica's published load counts other routers' requests: ``ReplicaLoad.other_routers``):
with ``near_share`` > 0 (an option, off by default) the choice is drawn at random among the candidates within
``near_share`` x the cheapest one's uncached tokens of its cost, about what queueing this request there adds to its
cost for the next; with ``near_pick="prefix_hash"`` not drawn but hashed (rendezvous) from the prompt's first block no
candidate holds over those candidates' ids, so requests sharing a new prefix go to one of them from every router.
Routers deciding inside one burst on the same published load otherwise all send it to the one
cheapest replica, which one router would have spread as its own bookings raised that replica's cost
(docs/multi-host-routers.md). A router alone takes the cheapest, and exact ties rotate so an idle cluster is filled
evenly.
With ``temperature > 0`` the choice is sampled with probability ``exp(-(cost - min_cost) / temperature)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from kvmesh.router.replicas.replica import Replica
from kvmesh.router.routing.candidates import Candidates
from kvmesh.router.routing.cost.load_columns import CandidateLoads
from kvmesh.router.routing.policies.base import Choice
from kvmesh.router.routing.policies.cache_aware_tokens_columns import cheapest_rows
from kvmesh.router.routing.policies.cache_aware_tokens_config import CacheAwareTokensConfig
from kvmesh.router.routing.policies.cache_aware_tokens_cost import TokensCost
from kvmesh.router.routing.policies.no_replica import check_candidates
from kvmesh.router.routing.policies.prefix_rendezvous import new_prefix_key, rendezvous
from kvmesh.router.routing.tier_matches import Matches, TierMatches

COLUMNS_FROM_CANDIDATES = 64
"""Candidates from which ``choose`` prices them in one numpy pass (below, numpy's fixed cost per call outweighs the
loop's: 0.12 against 0.10 ms per decision at 16 replicas, 0.14 against 0.15 at 128, ``kvmesh bench
route_scaling``)."""


class CacheAwareTokensPolicy(TokensCost):
    name = "cache_aware_tokens"
    config_type = CacheAwareTokensConfig
    config: CacheAwareTokensConfig

    def __init__(self, config: CacheAwareTokensConfig | None = None, block_size: int = 16,
                 seed: int | None = None) -> None:
        super().__init__(config, block_size, seed)
        self._tie = 0

    @property
    def tracks_evictions(self) -> bool:
        g = self.config.ghost_weight
        return g > 0 if g is not None else self._plans_pulls()

    @property
    def prices_pulls(self) -> bool:
        return self.config.price_pulls

    @staticmethod
    def _prices_adapter(lora_name: str | None, candidates: Candidates) -> bool:
        """The request names an adapter some candidate reports (its load then counts, in seconds)."""
        if lora_name is None:
            return False
        return any(r.load.lora is not None and lora_name in r.load.lora.adapters for r in candidates)

    def keeps_session(self, pinned: Replica, choice: Choice, request_keys: Sequence[int], tiers: TierMatches,
                      candidates: Candidates, num_prompt_tokens: int | None = None) -> bool:
        chosen = choice.replica
        costs = self.costs(request_keys, tiers.device, candidates.only(pinned, chosen), num_prompt_tokens)
        return costs[pinned.id] <= costs[chosen.id] + self.config.session_slack_tokens

    def choose(self, request_keys: Sequence[int], tiers: TierMatches, candidates: Candidates,
               num_prompt_tokens: int | None = None, lora_name: str | None = None) -> Replica:
        check_candidates(candidates)
        c, matches, host_matches = self.config, tiers.device, tiers.host
        priced = host_matches or c.temperature > 0 or self._prices_adapter(lora_name, candidates)
        if priced or self._prices_stored(candidates):
            costs = (self.ttft_s(request_keys, matches, host_matches, candidates, num_prompt_tokens, lora_name,
                                 tiers.pullable)
                     if host_matches or lora_name is not None
                     else self.costs(request_keys, matches, candidates, num_prompt_tokens, tiers.pullable))
            return self._cheapest(costs, candidates)
        prompt = num_prompt_tokens if num_prompt_tokens is not None else len(request_keys) * self.block_size
        loads, share = candidates.loads, self._near_share(candidates)
        if type(loads) is CandidateLoads and len(loads) >= COLUMNS_FROM_CANDIDATES:  # no ABC isinstance per request
            rows = cheapest_rows(c, self.block_size, prompt, matches, loads, share,
                                 0.0 if self.tail is None else self.tail.lift)
        else:
            rows = self._cheapest_walk(prompt, matches, candidates, share)
        if share > 0 and c.near_pick == "prefix_hash" and len(rows) > 1:
            key = new_prefix_key(request_keys, matches)
            return candidates[int(rows[rendezvous(key, [candidates[int(i)] for i in rows])])]
        return self._one_of(candidates, rows, share)

    def _near_share(self, candidates: Candidates) -> float:
        """``near_share`` where other routers book on these candidates too (``ReplicaLoad.other_routers``), else 0:
        a router alone sees each of its choices before the next."""
        return self.config.near_share if any(r.load.other_routers for r in candidates) else 0.0

    def _cheapest(self, costs: dict[str, float], candidates: Candidates) -> Replica:
        """The candidate of the lowest cost (``costs`` by id, in the candidates' order): ties rotate, or with
        ``temperature`` sampled."""
        best = min(costs.values())
        if self.config.temperature <= 0:
            return self._one_of(candidates, [i for i, cost in enumerate(costs.values()) if cost == best])
        t = self.config.temperature
        weights = [math.exp((best - cost) / t) for cost in costs.values()]
        return candidates[self.rng.choices(range(len(costs)), weights)[0]]

    def _one_of(self, candidates: Candidates, rows: Sequence[int], share: float = 0.0) -> Replica:
        """The candidate at the one position in ``rows``; among several, drawn at random where other routers book
        (``share`` > 0: their rotations would go in step), else the next in turn (an idle fleet fills evenly)."""
        if len(rows) == 1:
            return candidates[int(rows[0])]
        if share > 0:
            return candidates[int(rows[self.rng.randrange(len(rows))])]
        self._tie += 1
        return candidates[int(rows[self._tie % len(rows)])]

    def _cheapest_walk(self, prompt: int, matches: Matches, candidates: Candidates, share: float) -> list[int]:
        """The positions of the cheapest candidates and those within ``share`` of its uncached tokens of it, in one
        pass with the fields read directly (this runs once per request over every candidate): ``costs``' arithmetic
        inlined."""
        c = self.config
        bs, w, wb, get = self.block_size, c.decode_weight, self._backlog_weight(candidates), matches.get
        churn, release = self._churn_factor(candidates), c.backlog_release_tokens
        busy = self._busy(candidates, matches)
        cw, hi = c.churn_weight, c.churn_clamp
        lo, step = 1 / hi, c.decode_step_tokens
        queue_low, per_request = self._queue_span(candidates, prompt)
        best_cost, best_uncached, costs = math.inf, 0.0, []
        for replica in candidates:
            load = replica.load
            cached = get(replica.id)
            cost: float = prompt - bs * cached if cached else prompt
            if cost < 0:
                cost = 0
            uncached = cost
            backlog = load.prefill_backlog
            steps = (backlog + cost) / step
            ev = load.evicting if load.evicting > busy else busy
            if cost and churn and ev:  # turnover(), inlined: this loop runs per candidate
                x = churn * load.recent_prefill
                cost *= 1 + cw * ev * ((hi if x > hi else lo if x < lo else x) - 1)
            cost += wb * backlog + w * (steps if steps > 1 else 1) * load.decode_load
            if backlog > release:
                cost += (1 - wb) * (backlog - release)
            if per_request:
                cost += per_request * (load.decode_load - queue_low) * self._overflow(load)
            costs.append(cost)
            if cost < best_cost:
                best_cost, best_uncached = cost, uncached
        bound = best_cost + share * best_uncached
        return [i for i, cost in enumerate(costs) if cost <= bound]
