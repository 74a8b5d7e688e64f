"""Prometheus metrics of the live single-pool ceiling (router/routing/ceiling.py), read at scrape time:

    kvmesh_router_ceiling_prompt_tokens_total           prompt tokens of the requests the ceiling replayed
    kvmesh_router_ceiling_hit_tokens_total              of them, the single pool's hits
    kvmesh_router_ceiling_reported_hit_tokens_total     of them, the cached tokens the replicas reported
    kvmesh_router_ceiling_hit_ratio                     the single pool's hit rate (ceiling / prompt)
    kvmesh_router_hit_share_of_ceiling                  the fleet's hits as a share of the ceiling's
    kvmesh_router_prompt_miss_tokens_total{kind}        missed prompt tokens: stale_index, routed_away, evicted,
                                                        no_reuse
    kvmesh_router_ceiling_capacity_blocks               the single pool's blocks (the fleet's, as reported)

``kvmesh status`` prints them as one line (cluster/ceiling_status.py).
"""

from __future__ import annotations

from kvmesh.router.routing.ceiling import LiveCeiling
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

PREFIX = "kvmesh_router_"


class CeilingCollector:
    """The ceiling's totals as metric families (registered on the router's registry)."""

    def __init__(self, ceiling: LiveCeiling) -> None:
        self.ceiling = ceiling

    def collect(self):
        s = self.ceiling.summary()
        yield CounterMetricFamily(PREFIX + "ceiling_prompt_tokens", "Prompt tokens of the requests the live "
                                  "single-pool ceiling replayed", value=s["prompt_tokens"])
        yield CounterMetricFamily(PREFIX + "ceiling_hit_tokens", "Of them, the tokens one pool of the fleet's blocks "
                                  "would have had cached", value=s["ceiling_tokens"])
        yield CounterMetricFamily(PREFIX + "ceiling_reported_hit_tokens", "Of them, the cached tokens the replicas "
                                  "reported", value=s["hit_tokens"])
        yield GaugeMetricFamily(PREFIX + "ceiling_hit_ratio", "The single pool's hit rate over the prompt tokens "
                                "replayed", value=s["ceiling_hit_rate"])
        yield GaugeMetricFamily(PREFIX + "hit_share_of_ceiling", "The replicas' reported hits as a share of the "
                                "single pool's", value=s["share_of_ceiling"])
        misses = CounterMetricFamily(PREFIX + "prompt_miss_tokens", "Missed prompt tokens by kind: stale_index, "
                                     "routed_away, evicted, no_reuse", labels=["kind"])
        for kind, n in s["miss_tokens"].items():
            misses.add_metric([kind], n)
        yield misses
        yield GaugeMetricFamily(PREFIX + "ceiling_capacity_blocks", "Blocks of the single pool: the fleet's KV "
                                "blocks, as the replicas report them", value=s["capacity_blocks"])
