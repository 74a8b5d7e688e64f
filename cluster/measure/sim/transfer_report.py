"""What a run's KV transfers did (sim/transfer.py), for the report: splits and peer pulls, tokens and bytes
moved, TTFT of split and whole requests, inter-token latency, load balance per role; and the text table that
sets the compared configurations side by side.

Inter-token latency is counted per output token after the first: each decoding sequence waits one decode
step for each token, so a replica's decode steps, weighted by the sequences they serve, are its inter-token
latencies (``SimReplica.inter_token_s``). A long prefill chunk sharing a step with decodes shows up there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from kvmesh.cluster.measure.sim.config import cache_bytes_per_token
from kvmesh.cluster.measure.sim.stats import imbalance, percentiles, weighted_percentiles

if TYPE_CHECKING:
    from kvmesh.cluster.measure.sim.sim_run import SimRun


def transfer_summary(run: SimRun) -> dict:
    """The run's moves and the latencies they change (JSON-ready)."""
    reqs, config = run.requests, run.router.config
    prompt = sum(r.num_prompt_tokens for r in reqs) or 1
    split = [r for r in reqs if r.prefill_leg is not None]
    pulls = [r for r in reqs if r.pull_from is not None]
    moved = [r for r in reqs if r.num_transferred_tokens]
    split_tokens = sum(r.num_transferred_tokens for r in split)
    pulled_tokens = sum(r.num_transferred_tokens for r in pulls)
    histogram: dict[float, int] = {}
    for rep in run.replicas:
        for v, n in rep.inter_token_s.items():
            histogram[v] = histogram.get(v, 0) + n
    decoding = [rep for rep in run.replicas if rep.role != "prefill"]
    prefilling = [rep for rep in run.replicas if rep.role == "prefill"]
    return {
        "num_prefill_replicas": len(prefilling),
        "peer_pulls_enabled": config.peer_pulls,
        "splits": len(split),
        "splits_skipped_no_room": run.router.splits_skipped_no_room,
        "splits_skipped_slower": run.router.splits_skipped_slower,
        "split_tokens_moved": split_tokens,
        "peer_pulls": sum(1 for r in pulls if r.num_transferred_tokens),
        "peer_pulls_nothing_to_move": sum(1 for r in pulls if not r.num_transferred_tokens),
        "pulled_tokens": pulled_tokens,
        "pulled_hit_rate": pulled_tokens / prompt,
        "kv_bytes_moved": (split_tokens + pulled_tokens) * cache_bytes_per_token(config),
        "transfer_s": percentiles([r.transfer_s for r in moved]),
        "ttft_split_s": percentiles([r.first_token_s - r.arrival_s for r in split]),
        "ttft_whole_s": percentiles([r.first_token_s - r.arrival_s for r in reqs if r.prefill_leg is None]),
        "inter_token_s": weighted_percentiles(histogram),
        "decode_load_imbalance": imbalance([rep.busy_s for rep in decoding]),
        "prefill_load_imbalance": imbalance([rep.busy_s for rep in prefilling]) if prefilling else None,
        "busy_s_by_role": {role: float(np.mean([rep.busy_s for rep in group]))
                           for role, group in (("decode", decoding), ("prefill", prefilling)) if group},
    }


def format_transfer_table(report: dict) -> str:
    """One line per run: moves, hit rate, TTFT, inter-token latency and decode-side balance."""
    runs = {n: s for n, s in report["policies"].items() if "transfers" in s}
    width = max([16, *(len(name) + 2 for name in runs)])
    header = (f"{'run':<{width}}{'P':>3}{'splits':>8}{'pulls':>7}{'moved tok':>11}{'hit':>7}{'pulled':>8}"
              f"{'TTFT p50':>10}{'TTFT p99':>10}{'ITL p50':>9}{'ITL p99':>9}{'p99.9':>8}{'dec max/mean':>13}")
    lines = ["KV transfers (P = prefill replicas; hit = prompt tokens no replica computed; "
             "ITL = inter-token latency, s):", header, "-" * len(header)]
    for name, s in runs.items():
        t = s["transfers"]
        lines.append(
            f"{name:<{width}}{t['num_prefill_replicas']:>3}{t['splits']:>8}{t['peer_pulls']:>7}"
            f"{t['split_tokens_moved'] + t['pulled_tokens']:>11,}{s['hit_rate']:>7.1%}{t['pulled_hit_rate']:>8.1%}"
            f"{s['ttft_s']['p50']:>10.3f}{s['ttft_s']['p99']:>10.3f}{t['inter_token_s']['p50']:>9.4f}"
            f"{t['inter_token_s']['p99']:>9.4f}{t['inter_token_s']['p99.9']:>8.3f}{t['decode_load_imbalance']:>13.2f}")
    return "\n".join(lines)
