"""The prompt tokens a candidate would take into its cache, priced in prefill tokens for ``cache_aware_tokens``: the
ones it computes, the ones it may pull from a peer instead (at the pull's share of their compute time), and the
eviction damage of storing them where evicted blocks come back.

For a candidate holding ``own`` leading blocks of a prompt of ``prompt`` tokens::

    computed = prompt - block_size * (own + pulled_blocks)     (at least 0)
    price    = computed + pull_share * pulled_tokens            a pulled token costs pull_s / compute_s of one computed
    damage   = ghost_weight * comeback * duplicated               duplicated: tokens it stores that another holds

``pulled_blocks``: when pulls are priced (``PullPriors`` enabled) and the best device holder among the candidates
holds (for real: ``TierMatches.pullable``, not blocks credited to it for a request still queued there) more leading
blocks than the candidate, the candidate has no prefill queued, both report KV transfer on and the pull costs fewer
seconds than computing those tokens (pull.py, estimate.py's prefill rate), the candidate pulls the difference, as
``KVRouter`` then plans it (kv_placement.py). ``comeback`` (``ReplicaLoad.comeback``,
router/routing/eviction_ghosts.py) is the share of the blocks a replica stored lately that it had evicted before,
and ``comeback`` here its mean over the candidates: every token stored evicts one, which comes back (is recomputed) with
about this probability. A token no
replica holds must be stored somewhere, whichever candidate takes it; a token the candidate would compute or pull
while another replica holds it (``duplicated``: up to the best holder's match) is a second copy, one more block of
the fleet's cache taken, so it costs ``comeback`` more tokens later. ``ghost_weight`` 1 prices that expectation at
face value; with no evictions coming back anywhere it is 0.

A pull is priced onto an idle candidate only: that one starts the request at once, where a candidate with prefill
queued makes the request wait too, with its copy in a cache whose queued requests' prefixes sit there unreferenced
until they run, hits the copy pushes out that nothing here prices (``kvmesh sim --workload tool_agent --time-scale 0.5
--peer-pulls --kv-transfer-bytes-per-s 25e9 --arrival-seed 0``, pulls priced onto any candidate, no ghost term: the
pulling requests found a median 26,112 tokens queued there, and 23% of all requests hit other than predicted
against 10% with pulls unpriced).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kvmesh.kvcache.reuse import reusable_blocks
from kvmesh.router.replicas.load import ReplicaLoad
from kvmesh.router.replicas.replica import ReplicaId
from kvmesh.router.routing.cost.estimate import prefill_s_per_token
from kvmesh.router.routing.cost.fleet import FleetRates
from kvmesh.router.routing.cost.pull import PullPriors, can_pull, pull_holder, pull_seconds


@dataclass(frozen=True, slots=True)
class StoredTokens:
    """One candidate's new tokens for a request."""

    computed: float
    """Prompt tokens it would compute."""
    pulled: float
    """Prompt tokens it would pull from a peer instead."""
    price: float
    """Their price in prefill tokens: ``computed + pull_share * pulled``."""
    damage: float
    """Tokens its evictions are expected to cost later: ``ghost_weight * comeback * duplicated``."""


def stored_tokens(prompt: int, matches: Mapping[ReplicaId, int], loads: Mapping[ReplicaId, ReplicaLoad],
                  block_size: int, pulls: PullPriors | None, ghost_weight: float,
                  pullable: Mapping[ReplicaId, int] | None = None) -> dict[ReplicaId, StoredTokens]:
    """Every candidate's ``StoredTokens`` (``matches``: leading device blocks each holds; ``pullable``: of them, those
    events confirmed, which a pull can move now; None: all of ``matches``)."""
    holder, best = pull_holder(loads, matches if pullable is None else pullable, reusable_blocks(prompt, block_size),
                               pulls)
    fleet = FleetRates.of(loads.values()) if holder is not None else None
    held = min(max((m for rid, m in matches.items() if rid in loads), default=0), reusable_blocks(prompt, block_size))
    comeback = ghost_weight * sum(load.comeback for load in loads.values()) / len(loads) if ghost_weight else 0.0
    out = {}
    for rid, load in loads.items():
        own = matches.get(rid, 0)
        computed = float(max(prompt - block_size * own, 0))
        pulled, price = 0.0, computed
        if fleet is not None and best > own and rid != holder and not load.prefill_backlog \
                and can_pull(load, loads[holder], pulls):
            share = pull_share(load, fleet, best - own, block_size, pulls)
            if share is not None:
                pulled = float(min(computed, (best - own) * block_size))
                computed -= pulled
                price = computed + share * pulled
        damage = comeback * block_size * (held - own) if comeback and held > own else 0.0
        out[rid] = StoredTokens(computed, pulled, price, damage)
    return out


def pull_share(load: ReplicaLoad, fleet: FleetRates, num_blocks: int, block_size: int,
               pulls: PullPriors) -> float | None:
    """Seconds to pull ``num_blocks`` to ``load``'s replica over seconds to compute them there, when under 1 (None:
    no cheaper pull, or it cannot be priced)."""
    seconds = pull_seconds(load, fleet, num_blocks, block_size, pulls)
    spt = prefill_s_per_token(load, fleet)
    if seconds is None or spt is None:
        return None
    compute_s = num_blocks * block_size * spt
    return seconds / compute_s if seconds < compute_s else None


def pulls_possible(pulls: PullPriors | None, loads: Mapping[ReplicaId, ReplicaLoad]) -> bool:
    """Pulls are priced and some candidate reports KV transfer on."""
    return pulls is not None and pulls.enabled and any(load.kv_transfer_enabled for load in loads.values())
