"""The simulator's half of ``kvmesh bench emulated_fleet``: a trace workload's first requests as both sides send them
(the Mooncake trace, or another registered workload replayed at its records' times), run through ``kvmesh sim``'s
miniature (16-token blocks, per-token costs x32), written as JSON with each request's TTFT and the fleet's sizes,
which the live half gives its emulated replicas (the cost model is their profile).

    python -m kvmesh.cluster.measure.sim.emulated_check --replicas 16 --num-requests 200 --out sim.json
    python -m kvmesh.cluster.measure.sim.emulated_check --workload azure_code --speedup 3 --out sim.json
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, replace
from pathlib import Path

from kvmesh.cluster.measure.workloads.settings import MINIATURE


def requests(num_requests: int, max_prompt_tokens: int, max_tokens: int, workload: str = "mooncake") -> list:
    """The workload's first records as both sides send them (``kvmesh bench load``'s records of ``workload``, at its
    default shape): prompts cut to whole 16-token blocks, outputs capped. A workload of conversations is refused:
    its turns are sent as earlier ones finish, which no replay at the records' times reproduces."""
    from kvmesh.cluster.measure.sim.request import cut_trace
    from kvmesh.cluster.measure.workloads.registry import get_workload
    from kvmesh.cluster.measure.workloads.settings import LOAD_SHAPE, WorkloadSettings

    entry = get_workload(workload)
    if entry.conversation or entry.real_lengths:
        raise ValueError(f"workload {workload!r} is not replayed at its records' times with 16 tokens per trace "
                         "block; give a trace workload such as mooncake or azure_code")
    settings = WorkloadSettings(num_requests=num_requests, trace=None, trace_limit=num_requests,
                                prompt_tokens=max_prompt_tokens * MINIATURE, answer_tokens=max_tokens * MINIATURE,
                                shape=LOAD_SHAPE, seed=0)
    records = cut_trace(entry.make(settings), 0, num_requests, max_prompt_blocks=max_prompt_tokens // 16)
    return [replace(r, output_length=max(1, min(max_tokens, r.output_length))) for r in records]


def simulate(records: list, replicas: int, policy: str, seed: int, capacity_fraction: float,
             speedup: float = 1.0, replica_of: dict[str, str] | None = None, predict_hold_s: float = 0.0) -> dict:
    """``kvmesh sim``'s run of ``policy`` on the miniature of ``records`` sent ``speedup`` times as fast as their
    times say: its shares, TTFTs and the fleet it used. ``replica_of`` (request id -> a live run's replica): every
    request placed as the live run placed it instead (sim/placement_replay.py). ``predict_hold_s``: the router's."""
    from kvmesh.cluster.measure.sim.config import SimConfig, miniature
    from kvmesh.cluster.measure.sim.loop import run_policy
    from kvmesh.cluster.measure.sim.placement_replay import PlacementReplay, placements
    from kvmesh.cluster.measure.sim.report import summarize
    from kvmesh.cluster.measure.sim.request import requests_from_mooncake
    from kvmesh.cluster.measure.sim.run import BlockTokenCache, blocks_per_replica
    from kvmesh.router.config import RouterConfig

    config = miniature(SimConfig(num_replicas=replicas, seed=seed, capacity_fraction=capacity_fraction,
                                 router=RouterConfig(predict_hold_s=predict_hold_s)), MINIATURE)
    block = config.engine.block_size  # a replica holds at least two of the largest requests
    largest = max(-(-(r.num_prompt_tokens + r.max_output_tokens) // block)
                  for r in requests_from_mooncake(records, 1.0, block))
    per_replica = max(blocks_per_replica(config, records), 2 * largest)
    config = replace(config, blocks_per_replica=per_replica)
    reqs = requests_from_mooncake(records, 1 / speedup, block)
    replay = None if replica_of is None else PlacementReplay(
        placements([r.request_id for r in reqs], replica_of, [str(k) for k in range(replicas)]), block)
    run = run_policy(policy, reqs, config, per_replica, BlockTokenCache(block, config.vocab_size, config.seed),
                     routed_by=replay)
    summary = summarize(run)
    return {"cached_share": summary["cached_tokens"] / summary["prompt_tokens"], "ttft_s": summary["ttft_s"],
            "ttft_by_request": {r.request_id: r.first_token_s - r.arrival_s for r in run.requests},
            "cached_by_request": {r.request_id: r.num_cached_tokens for r in run.requests},
            "replica_by_request": {r.request_id: r.replica_id for r in run.requests},
            "predicted_by_request": {r.request_id: r.predicted_hit_tokens for r in run.requests},
            "receipt_by_request": {r.request_id: {"reason": r.receipt.reason, "best": r.receipt.best_hit_tokens}
                                   for r in run.requests if r.receipt is not None},
            "blocks_per_replica": per_replica, "cost": asdict(config.cost),
            "max_num_batched_tokens": config.engine.max_num_batched_tokens, "max_num_seqs": config.engine.max_num_seqs}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=16)
    ap.add_argument("--workload", default="mooncake", help="a trace workload (kvmesh bench load's)")
    ap.add_argument("--speedup", type=float, default=1.0, help="send the records this many times as fast")
    ap.add_argument("--num-requests", type=int, default=200)
    ap.add_argument("--max-prompt-tokens", type=int, default=1024)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--policy", default="cache_aware_tokens")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--capacity-fraction", type=float, default=1.0)
    ap.add_argument("--placements", default=None,
                    help="a JSON file of request id -> the replica a live run sent it to: place every request so")
    ap.add_argument("--predict-hold-s", type=float, default=0.0, help="the router's predict_hold_s (0: off)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    records = requests(args.num_requests, args.max_prompt_tokens, args.max_tokens, args.workload)
    replica_of = json.loads(Path(args.placements).read_text()) if args.placements else None
    result = simulate(records, args.replicas, args.policy, args.seed, args.capacity_fraction, args.speedup,
                      replica_of, args.predict_hold_s)
    Path(args.out).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
