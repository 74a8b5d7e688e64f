"""``cache_aware_tokens`` (default): the replica where the request would finish its prefill soonest in prefill-token
units with weights tuned in the simulator, counting what its new blocks will evict. ``cache_aware`` prices the choice
in seconds without weights (policies/cache_aware.py); on the Mooncake trace it keeps fewer hits (BENCHMARKS.md).

For each candidate replica ``r``, in prefill-token units::

    cost(r) = uncached(r) * turnover(r)            prompt tokens it would still compute (prompt - cached prefix)
            + backlog_w * prefill_backlog(r)       prompt tokens queued before ours
            + decode_weight * steps(r) * decode_load(r)   running requests slowing every step

    steps(r) = max(1, (prefill_backlog(r) + uncached(r)) / decode_step_tokens)   steps until our first token

    turnover(r) = 1 + churn_weight * g(r) * (x - 1),   x = recent_prefill(r) / mean recent_prefill,
                                                         clamped to [1 / churn_clamp, churn_clamp]
    g(r)        = 1, or with turnover_while_filling off: max(evicting(r), busy)
    backlog_w   = backlog_weight + (filling_backlog_weight - backlog_weight) * (1 - mean evicting)

``evicting(r)``: the share of the blocks ``r`` stored lately that evicted one, from its KV events
(``ReplicaLoad.evicting``, router/routing/evicting.py): 0 while its cache fills, about 1 once full. ``busy``: the
share of candidates with requests queued or running (``busy_turnover``; 0 when off).

The trade-off is continuous, not a threshold: a cached prefix keeps attracting requests until the
replica's backlog outweighs the prefill it saves. ``backlog_weight`` < 1 leans towards reuse:
queued prefill only delays this request, while prefill saved by a hit is compute every later
request gets back (and a burst sharing a new prefix stays on the replica that is computing it).
``turnover`` makes the choice eviction-aware: every uncached token stored on a replica evicts one
from the tail of its LRU, and a replica that takes in new tokens faster than the others has a
younger, likelier-reused tail. Steering new work towards slow-turnover replicas makes the
partitioned caches behave more like one LRU pool (the simulator's attribution: fewer prefixes
evicted from every replica). A replica not evicting evicts nothing by storing a token; its intake is
priced only as far as the fleet is busy, where spreading it evens the queues: on an idle fleet a
conversation's next turn stays on its holder. ``filling_backlog_weight`` (an option, off) weighs the
queue apart while the fleet fills, when a copy of a prefix costs no later hit. ``steps`` puts the decode term in time: ``decode_weight`` (8) is about
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
With ``temperature > 0`` the choice is sampled
with probability ``exp(-(cost - min_cost) / temperature)``, spreading load over near-equal
replicas; exact ties at temperature 0 rotate so an idle cluster is filled evenly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from operator import attrgetter

import numpy as np
from kvmesh.kvcache.reuse import reusable_blocks
from kvmesh.router.routing.cost import FleetRates
from kvmesh.router.routing.cost.estimate import adapter_s
from kvmesh.router.routing.cost.load_columns import CandidateLoads
from kvmesh.router.routing.cost.stored_tokens import pulls_possible, stored_tokens
from kvmesh.router.routing.policies.base import (
    Choice,
    Loads,
    Matches,
    Policy,
    ReplicaId,
)
from kvmesh.router.routing.policies.cache_aware_tokens_config import CacheAwareTokensConfig
from kvmesh.router.routing.policies.no_replica import check_candidates
from kvmesh.router.routing.tier_matches import TierMatches

_RECENT_PREFILL = attrgetter("recent_prefill")
_EVICTING = attrgetter("evicting")
COLUMNS_FROM_CANDIDATES = 64
"""Candidates from which ``choose`` prices them in one numpy pass (below, numpy's fixed cost per call outweighs the
loop's: 0.12 against 0.10 ms per decision at 16 replicas, 0.14 against 0.15 at 128, ``kvmesh bench
route_scaling``)."""


class CacheAwareTokensPolicy(Policy):
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

    def costs(self, request_keys: Sequence[int], matches: Matches, loads: Loads,
              num_prompt_tokens: int | None = None, pullable: Matches | None = None) -> dict[ReplicaId, float]:
        """Cost of every candidate replica (for metrics and tests; ``pullable``: ``TierMatches.pullable``)."""
        prompt = num_prompt_tokens if num_prompt_tokens is not None else len(request_keys) * self.block_size
        bs, w, get = self.block_size, self.config.decode_weight, matches.get
        churn, wb, busy = self._churn_factor(loads), self._backlog_weight(loads), self._busy(loads)
        if self._prices_stored(loads):
            return self._stored_costs(prompt, matches, loads, churn, wb, busy, pullable)
        out = {}
        for rid, load in loads.items():
            uncached: float = prompt - bs * get(rid, 0)
            uncached = uncached if uncached > 0 else 0
            backlog = load.prefill_backlog
            steps = self._steps(backlog + uncached)
            if churn:
                uncached *= self._turnover(churn * load.recent_prefill, max(load.evicting, busy))
            out[rid] = uncached + self._backlog_cost(backlog, wb) + w * steps * load.decode_load
        return out

    def _plans_pulls(self) -> bool:
        """Pulls are priced and the router plans them (``use_pulls``)."""
        return self.config.price_pulls and self.pulls is not None and self.pulls.enabled

    def _ghost_weight(self, pulls_priced: bool) -> float:
        """``ghost_weight``, or where unset 1 when this decision prices pulls (the copy a pull makes) and 0 else."""
        g = self.config.ghost_weight
        return g if g is not None else 1.0 if pulls_priced else 0.0

    def _prices_stored(self, loads: Loads) -> bool:
        """Eviction damage or pulls are priced for these candidates (``_stored_costs``)."""
        if self.config.price_pulls and pulls_possible(self.pulls, loads):
            return True
        return bool(self._ghost_weight(False) and any(load.comeback for load in loads.values()))

    def _stored_costs(self, prompt: int, matches: Matches, loads: Loads, churn: float, wb: float, busy: float,
                      pullable: Matches | None = None) -> dict[ReplicaId, float]:
        """``costs`` with the new tokens priced by cost/stored_tokens.py: pulled ones at the pull's share, plus the
        eviction damage of storing them, and the computed ones once more per pull landing on the candidate."""
        c = self.config
        pulls = self.pulls if c.price_pulls and pulls_possible(self.pulls, loads) else None
        stored = stored_tokens(prompt, matches, loads, self.block_size, pulls, self._ghost_weight(pulls is not None),
                               pullable)
        out = {}
        for rid, load in loads.items():
            s, backlog = stored[rid], load.prefill_backlog
            steps = self._steps(backlog + s.computed)
            price = s.price * self._turnover(churn * load.recent_prefill, max(load.evicting, busy)) if churn and s.price \
                else s.price
            out[rid] = price + s.damage + self._backlog_cost(backlog, wb) + c.decode_weight * steps * load.decode_load
            if load.landing_pulls:  # computed ahead of each pull landing there: it waits through them
                out[rid] += load.landing_pulls * s.computed
        return out

    def _steps(self, prefill_tokens: float) -> float:
        """Engine steps until ``prefill_tokens`` (queued + this request's uncached) are computed, >= 1."""
        steps = prefill_tokens / self.config.decode_step_tokens
        return steps if steps > 1 else 1.0

    def _backlog_cost(self, backlog: float, wb: float) -> float:
        """Queued prefill at weight ``wb`` (``_backlog_weight``), in full past ``backlog_release_tokens``."""
        release = self.config.backlog_release_tokens
        return wb * backlog + ((1 - wb) * (backlog - release) if backlog > release else 0.0)

    def _backlog_weight(self, loads: Loads) -> float:
        """``backlog_weight`` on an evicting fleet, ``filling_backlog_weight`` on a filling one, in between by the
        candidates' mean ``evicting``."""
        c = self.config
        fill, wb = c.filling_backlog_weight, c.backlog_weight
        if fill is None or fill == wb:
            return wb
        return wb + (fill - wb) * (1 - sum(map(_EVICTING, loads.values())) / len(loads))

    @staticmethod
    def _prices_adapter(lora_name: str | None, loads: Loads) -> bool:
        """The request names an adapter some candidate reports (its load then counts, in seconds)."""
        if lora_name is None:
            return False
        return any(load.lora is not None and lora_name in load.lora.adapters for load in loads.values())

    def _busy(self, loads: Loads) -> float:
        """With ``busy_turnover``, the share of candidates with requests queued or running (0: off; 1 with
        ``turnover_while_filling``, so every replica's turnover counts whole)."""
        if self.config.turnover_while_filling:
            return 1.0
        if not self.config.busy_turnover:
            return 0.0
        return sum(1 for load in loads.values() if load.prefill_backlog or load.decode_load) / len(loads)

    def _churn_factor(self, loads: Loads) -> float:
        """``1 / mean recent_prefill`` over the candidates (0: no churn term)."""
        if not self.config.churn_weight:
            return 0.0
        total = sum(map(_RECENT_PREFILL, loads.values()))
        return len(loads) / total if total > 0 else 0.0

    def _turnover(self, ratio: float, evicting: float) -> float:
        """What one uncached token costs on a replica at ``ratio`` of the mean intake, ``evicting`` as it is."""
        clamp = self.config.churn_clamp
        ratio = clamp if ratio > clamp else 1 / clamp if ratio * clamp < 1 else ratio
        return 1 + self.config.churn_weight * evicting * (ratio - 1)

    def keeps_session(self, pinned: ReplicaId, choice: Choice, request_keys: Sequence[int], matches: Matches,
                      loads: Loads, num_prompt_tokens: int | None = None) -> bool:
        chosen = choice.replica_id
        costs = self.costs(request_keys, matches, {pinned: loads[pinned], chosen: loads[chosen]},
                           num_prompt_tokens)
        return costs[pinned] <= costs[chosen] + self.config.session_slack_tokens

    def ttft_s(self, request_keys: Sequence[int], matches: Matches, host_matches: Matches, loads: Loads,
               num_prompt_tokens: int | None = None, lora_name: str | None = None,
               pullable: Matches | None = None) -> dict[ReplicaId, float]:
        """Estimated seconds to first token on every candidate (see "Tiers, in seconds" above), with the load of
        ``lora_name`` where it is not resident (``cost.estimate.adapter_s``)."""
        prompt = num_prompt_tokens if num_prompt_tokens is not None else len(request_keys) * self.block_size
        usable = reusable_blocks(prompt, self.block_size)  # an engine computes at least the last token
        device, host = matches.get, host_matches.get
        extra = {rid: max(0, min(host(rid, 0), usable) - device(rid, 0)) for rid in loads}
        either = {rid: device(rid, 0) + extra[rid] for rid in loads}
        costs = self.costs(request_keys, either, loads, prompt, pullable)
        rates = [load.prefill_tokens_per_s for load in loads.values() if load.prefill_tokens_per_s]
        mean_rate = sum(rates) / len(rates) if rates else None
        if mean_rate is None:
            return costs
        fleet = FleetRates.of(loads.values()) if lora_name is not None else None
        return {rid: costs[rid] / (load.prefill_tokens_per_s or mean_rate) + load.load_back_s(extra[rid])
                + (adapter_s(load, fleet, lora_name) if fleet is not None else 0.0)
                for rid, load in loads.items()}

    def choose(self, request_keys: Sequence[int], tiers: TierMatches, loads: Loads,
               num_prompt_tokens: int | None = None, lora_name: str | None = None) -> ReplicaId:
        check_candidates(loads)
        c, matches, host_matches = self.config, tiers.device, tiers.host
        if host_matches or c.temperature > 0 or self._prices_adapter(lora_name, loads) or self._prices_stored(loads):
            costs = (self.ttft_s(request_keys, matches, host_matches, loads, num_prompt_tokens, lora_name, tiers.pullable)
                     if host_matches or lora_name is not None
                     else self.costs(request_keys, matches, loads, num_prompt_tokens, tiers.pullable))
            best = min(costs.values())
            if c.temperature <= 0:
                ties = [rid for rid, cost in costs.items() if cost == best]
                if len(ties) == 1:
                    return ties[0]
                self._tie += 1
                return ties[self._tie % len(ties)]
            t = c.temperature
            weights = [math.exp((best - cost) / t) for cost in costs.values()]
            return self.rng.choices(list(costs), weights)[0]
        prompt = num_prompt_tokens if num_prompt_tokens is not None else len(request_keys) * self.block_size
        if type(loads) is CandidateLoads and len(loads) >= COLUMNS_FROM_CANDIDATES:  # no ABC isinstance per request
            return self._choose_from_columns(prompt, matches, loads)
        # One pass, fields read directly (this runs once per request over every candidate).
        bs, w, wb, get = self.block_size, c.decode_weight, self._backlog_weight(loads), matches.get
        churn, release, busy = self._churn_factor(loads), c.backlog_release_tokens, self._busy(loads)
        cw, hi = c.churn_weight, c.churn_clamp
        lo, step = 1 / hi, c.decode_step_tokens
        best_cost, ties = math.inf, []
        for rid, load in loads.items():
            cached = get(rid)
            cost: float = prompt - bs * cached if cached else prompt
            if cost < 0:
                cost = 0
            backlog = load.prefill_backlog
            steps = (backlog + cost) / step
            ev = load.evicting if load.evicting > busy else busy
            if cost and churn and ev:  # turnover(), inlined: this loop runs per candidate
                x = churn * load.recent_prefill
                cost *= 1 + cw * ev * ((hi if x > hi else lo if x < lo else x) - 1)
            cost += wb * backlog + w * (steps if steps > 1 else 1) * load.decode_load
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

    def _choose_from_columns(self, prompt: int, matches: Matches, loads: CandidateLoads) -> ReplicaId:
        """``choose``'s loop as one numpy pass over the candidates' rows of the load columns: the same arithmetic in
        the same order, so the same floats and the same choice (tests/router/test_tokens_policy_columns.py)."""
        c, cols, rows = self.config, loads.columns, loads.rows
        cached = np.zeros(len(cols.ids), dtype=np.int64)
        row_of = cols.row
        for rid, blocks in matches.items():
            row = row_of(rid)
            if row is not None:
                cached[row] = blocks
        cost = np.maximum(prompt - self.block_size * cached[rows], 0).astype(np.float64)  # [k] uncached tokens
        backlog, decode = cols.backlog[rows], cols.batch[rows]
        steps = np.maximum((backlog + cost) / c.decode_step_tokens, 1.0)
        recent = cols.recent_prefill[rows]
        total = sum(recent.tolist()) if c.churn_weight else 0.0  # summed as _churn_factor sums, in row order
        evicting = cols.evicting[rows]
        if total > 0:
            busy = 1.0 if c.turnover_while_filling else \
                np.count_nonzero((backlog != 0) | (decode != 0)) / len(rows) if c.busy_turnover else 0.0
            g = np.maximum(evicting, busy)
            x = np.clip((len(rows) / total) * recent, 1 / c.churn_clamp, c.churn_clamp)
            cost = np.where((cost != 0) & (g != 0), cost * (1 + c.churn_weight * g * (x - 1)), cost)
        fill, wb = c.filling_backlog_weight, c.backlog_weight
        if fill is not None and fill != wb:
            wb += (fill - wb) * (1 - sum(evicting.tolist()) / len(rows))
        cost = cost + (wb * backlog + c.decode_weight * steps * decode)
        release = c.backlog_release_tokens
        if release < math.inf:
            cost = np.where(backlog > release, cost + (1 - wb) * (backlog - release), cost)
        ties = np.flatnonzero(cost == cost.min())
        if len(ties) == 1:
            return cols.ids[rows[ties[0]]]
        self._tie += 1
        return cols.ids[rows[ties[self._tie % len(ties)]]]
