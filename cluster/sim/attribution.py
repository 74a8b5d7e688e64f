"""Where a policy's hit tokens went, against the single pool: every lost token gets one cause.

For each request, with ``pool`` = tokens the single pool found cached, ``best`` = the best hit any
candidate replica offered when the router decided, ``predicted`` = the chosen replica's hit in
the router's view, ``actual`` = what the chosen replica found on admission (the receipt)::

    pool - actual = (pool - best)           not held by any replica when routed (evictions of the
                                            partitioned pools; negative where a replica kept a
                                            prefix the single pool had evicted)
                  + (best - predicted)      given away by the policy (load or session diversions)
                  + (predicted - actual)    changed between routing and admission (evicted while
                                            queued; negative: stored meanwhile, e.g. by a
                                            request of the same prefix routed just before)

Each term is summed over requests and reported as points of hit rate (fraction of all prompt
tokens); the positive and negative parts of the first and last terms are kept apart.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvmesh.cluster.sim.request import SimRequest


def attribute_gap(requests: Sequence[SimRequest], pool_hits: Sequence[int]) -> dict:
    """The decomposition above for one run (``pool_hits[i]`` belongs to ``requests[i]``)."""
    if len(pool_hits) != len(requests):
        raise ValueError(f"{len(pool_hits)} single-pool hits for {len(requests)} requests")
    prompt = sum(r.num_prompt_tokens for r in requests) or 1
    evicted = kept = diverted = race_lost = race_gained = 0
    for r, pool in zip(requests, pool_hits, strict=True):
        best, predicted = r.receipt.best_hit_tokens, r.predicted_hit_tokens
        held = pool - best
        if held > 0:
            evicted += held
        else:
            kept -= held
        diverted += best - predicted
        race = predicted - r.num_cached_tokens
        if race > 0:
            race_lost += race
        else:
            race_gained -= race
    pool_total = sum(pool_hits)
    actual = sum(r.num_cached_tokens for r in requests)
    return {
        "gap_points": 100 * (pool_total - actual) / prompt,
        "evicted_everywhere_points": 100 * evicted / prompt,
        "kept_beyond_pool_points": 100 * kept / prompt,
        "diverted_points": 100 * diverted / prompt,
        "routing_admission_race_lost_points": 100 * race_lost / prompt,
        "routing_admission_race_gained_points": 100 * race_gained / prompt,
    }
