"""The live single-pool ceiling line of ``kvmesh status``, read from the router's /metrics
(``kvmesh_router_ceiling_*``, router/http/ceiling_metrics.py):

    single pool: hits 91.2% of the ceiling (one pool of 52,000 blocks: 48.0% of 1,204,224 prompt tokens);
    misses: stale index 0.4%, routed away 3.1%, evicted 6.0%, no reuse 46.2% of prompt tokens

With ``router.workers`` > 1 the numbers are those of the worker that answered /metrics, as for every router metric.
"""

from __future__ import annotations

from kvmesh.router.routing.ceiling import MISS_KINDS

_NAMES = {"kvmesh_router_ceiling_prompt_tokens_total": "prompt", "kvmesh_router_ceiling_hit_tokens_total": "ceiling",
          "kvmesh_router_ceiling_reported_hit_tokens_total": "hit", "kvmesh_router_ceiling_capacity_blocks": "blocks"}


def ceiling_figures(text: str) -> dict | None:
    """The ceiling's totals from the router's Prometheus ``text`` (None: it exports none, or replayed nothing)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict = {"misses": {}}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in _NAMES:
                out[_NAMES[s.name]] = s.value
            elif s.name == "kvmesh_router_prompt_miss_tokens_total":
                out["misses"][s.labels.get("kind", "")] = s.value
    return out if out.get("prompt") else None


def ceiling_line(figures: dict | None) -> str:
    """The two lines above (a line saying none was measured yet without figures)."""
    if figures is None:
        return "single pool: no request replayed yet (the router counts one when its replica reports cached tokens)"
    prompt, ceiling, hit = figures["prompt"], figures.get("ceiling", 0.0), figures.get("hit", 0.0)
    share = f"{hit / ceiling:.1%} of the ceiling" if ceiling else "no ceiling hit yet"
    misses = ", ".join(f"{kind.replace('_', ' ')} {figures['misses'].get(kind, 0.0) / prompt:.1%}"
                       for kind in MISS_KINDS)
    return (f"single pool: hits {share} (one pool of {figures.get('blocks', 0):,.0f} blocks: {ceiling / prompt:.1%} of "
            f"{prompt:,.0f} prompt tokens);\nmisses: {misses} of prompt tokens")
