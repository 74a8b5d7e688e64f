"""``kvmesh sim``: compare routing policies on a trace with simulated replicas (see kvmesh.cluster.sim)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import fields
from pathlib import Path

DEFAULT_TRACE = "mooncake_synthetic_trace.jsonl"
WORKLOADS = ("mooncake", "multi_turn", "tool_agent", "azure_conv", "azure_code")
SESSION_MODES = {"off": {" ": False}, "on": {"/sessions": True}, "both": {"/no-sessions": False, "/sessions": True}}


def default_trace(name: str = DEFAULT_TRACE) -> str:
    shared = os.environ.get("KVMESH_SHARED_DIR")
    root = Path(shared) if shared else Path(__file__).resolve().parents[2].parent / "shared"
    return str(root / "traces" / name)


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return values


def _key_value(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "sim", help="replay a trace through the real router in front of simulated replicas",
        description="Replay a Mooncake hash_ids trace through the real router index and policies in front "
                    "of N simulated replicas (real kvcache block pools, model time from a cost model), and "
                    "compare policies: prefix hit rate vs. infinite-cache and single-pool ceilings, TTFT and "
                    "queueing p50/p99, load imbalance, events/s. Writes JSON + a PNG plot. "
                    "`kvmesh sim scaling --help`: an autoscaled fleet against a fixed one over a varying rate.")
    p.add_argument("--trace", default=default_trace(), help="Mooncake JSONL trace (default: %(default)s)")
    p.add_argument("--synthetic", type=int, default=None, metavar="N",
                   help="simulate N generated multi-turn requests instead of --trace (cluster/sim/workloads.py)")
    p.add_argument("--synthetic-rate", type=float, default=1.0,
                   help="conversations (multi_turn) or agents (tool_agent) started per second")
    p.add_argument("--workload", choices=WORKLOADS, default="mooncake",
                   help="mooncake: --trace; multi_turn, tool_agent: generated (--num-requests); azure_conv, "
                        "azure_code: the Azure trace's arrivals and lengths with generated shared prefixes "
                        "(cluster/sim/workloads.py). Default: %(default)s")
    p.add_argument("--num-requests", type=int, default=2000, help="requests of a generated workload")
    p.add_argument("--burst", type=float, default=0.0, metavar="FACTOR",
                   help="warp arrivals into bursts of FACTOR x the mean rate (0 = off; FACTOR * --burst-duty < 1)")
    p.add_argument("--burst-duty", type=float, default=0.2, help="fraction of each burst period that bursts")
    p.add_argument("--burst-period", type=float, default=60.0, help="seconds between burst starts")
    p.add_argument("--routers", type=_int_list, default=[1], metavar="N[,N...]",
                   help="independent routers with requests spread over them; a list (1,4) runs each "
                        "policy once per count (default: 1)")
    p.add_argument("--router-spread", choices=("round_robin", "random"), default="round_robin",
                   help="how requests are spread over the routers")
    p.add_argument("--load-poll", type=float, default=None, metavar="SECONDS",
                   help="each router polls every replica's /load this often (default: 0.5 s with "
                        "several routers, else off)")
    p.add_argument("--share-predictions", action="store_true",
                   help="routers tell each other their decisions (predicted entries in every index)")
    p.add_argument("--share-loads", action="store_true",
                   help="routers share their in-flight counts (every router counts every dispatch)")
    p.add_argument("--share-sessions", action="store_true",
                   help="routers share one session table (a pin made by one is seen by all)")
    p.add_argument("--sessions", choices=tuple(SESSION_MODES), default="off",
                   help="pass the workload's session ids to the router: off, on, or both side by side")
    p.add_argument("--session-ttl", type=float, default=600.0, help="seconds a session pin lives")
    p.add_argument("--start", type=int, default=0, help="skip the first N requests (a window of the trace)")
    p.add_argument("--limit", type=int, default=None, help="use only N requests (from --start)")
    p.add_argument("--max-prompt-blocks", type=int, default=None,
                   help="truncate prompts to this many hash ids (keeps prefixes; for quick cuts)")
    p.add_argument("--num-replicas", type=int, default=16, help="simulated replicas (default: 16)")
    p.add_argument("--policies", default=None,
                   help="comma-separated policies (default: every registered policy)")
    p.add_argument("--block-size", type=int, default=512,
                   help="tokens per KV block of a replica; 512 = one Mooncake hash_id per block (default)")
    p.add_argument("--miniature", type=int, default=1, metavar="FACTOR",
                   help="divide every token count by FACTOR and multiply per-token costs by it: same model "
                        "time, FACTOR times less hashing (quick runs; default: 1 = off)")
    p.add_argument("--blocks-per-replica", type=int, default=None, help="KV blocks per replica")
    p.add_argument("--capacity-fraction", type=float, default=0.25,
                   help="total KV capacity as a fraction of the trace's working set (default: 0.25)")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="multiply arrival times by this (0.25 = 4x the request rate)")
    p.add_argument("--event-delay", type=float, default=0.0, help="seconds before the router sees an event")
    p.add_argument("--predict-ttl-s", type=float, default=2.0,
                   help="seconds a routed request's blocks count as held before events arrive; 0 = off")
    p.add_argument("--max-num-batched-tokens", type=int, default=8192, help="token budget per step")
    p.add_argument("--max-num-seqs", type=int, default=256, help="most running sequences per replica")
    p.add_argument("--cost", type=_key_value, action="append", default=[], metavar="FIELD=SECONDS",
                   help="override a CostModel constant, e.g. --cost prefill_s_per_token=1e-4 (repeatable)")
    p.add_argument("--policy-kwargs", type=_key_value, action="append", default=[], metavar="KEY=VALUE",
                   help="keyword argument for the policies, e.g. --policy-kwargs decode_weight=8 (repeatable)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-ceilings", action="store_true", help="skip the infinite/single-pool ceilings")
    p.add_argument("--out", default="results/sim.json", help="JSON report path (default: %(default)s)")
    p.add_argument("--plot", default=None, help="PNG path (default: the JSON path with .png)")
    p.add_argument("--no-plot", action="store_true", help="write no PNG")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run)


def build_config(args):
    from kvmesh.cluster.sim.config import CostModel, SimConfig, miniature

    known = {f.name for f in fields(CostModel)}
    for key, _ in args.cost:
        if key not in known:
            raise ValueError(f"--cost {key}: unknown CostModel field; choose from {sorted(known)}")
    cost = CostModel(**{k: float(v) for k, v in args.cost})
    return miniature(SimConfig(
        num_replicas=args.num_replicas, block_size=args.block_size, blocks_per_replica=args.blocks_per_replica,
        capacity_fraction=args.capacity_fraction, max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs, event_delay_s=args.event_delay, predict_ttl_s=args.predict_ttl_s,
        time_scale=args.time_scale, num_routers=args.routers[0], router_spread=args.router_spread,
        load_poll_s=load_poll_s(args), share_predictions=args.share_predictions, share_loads=args.share_loads,
        share_sessions=args.share_sessions,
        session_ttl_s=args.session_ttl,
        seed=args.seed, cost=cost, policy_kwargs=dict(args.policy_kwargs)), args.miniature)


def load_poll_s(args) -> float:
    if args.load_poll is not None:
        if args.load_poll < 0:
            raise ValueError(f"--load-poll must be >= 0 seconds, got {args.load_poll}")
        return args.load_poll
    return 0.5 if max(args.routers) > 1 else 0.0


def variants(args) -> dict[str, dict] | None:
    """Label suffix -> SimConfig changes, one run per entry and policy (None: one plain run)."""
    routers = args.routers if len(args.routers) > 1 else [None]
    sessions = SESSION_MODES[args.sessions]
    out = {}
    for n in routers:
        for suffix, on in sessions.items():
            label = (f"/{n}r" if n is not None else "") + suffix.strip()
            out[label] = {"use_sessions": on} | ({"num_routers": n} if n is not None else {})
    return out if len(out) > 1 or args.sessions != "off" else None


def load_workload(args) -> list:
    """The records of ``--workload`` (or ``--synthetic``), bursty if asked."""
    from kvmesh.cluster.benchmarks.traces import read_azure, read_mooncake
    from kvmesh.cluster.sim.workloads import AzurePrefixes, SyntheticTrace, ToolAgentTrace, bursty

    workload = "multi_turn" if args.synthetic else args.workload
    if workload == "multi_turn":
        records = SyntheticTrace(num_requests=args.synthetic or args.num_requests,
                                 conversations_per_s=args.synthetic_rate, seed=args.seed).records()
    elif workload == "tool_agent":
        records = ToolAgentTrace(num_requests=args.num_requests, agents_per_s=args.synthetic_rate,
                                 seed=args.seed).records()
    elif workload.startswith("azure_"):
        name = "AzureLLMInferenceTrace_" + workload.removeprefix("azure_") + ".csv"
        records = AzurePrefixes(seed=args.seed).records(read_azure(default_trace(name)))
    else:
        records = read_mooncake(args.trace)
    if args.burst:
        records = bursty(records, args.burst, args.burst_duty, args.burst_period)
    return records


def run(args) -> int:
    from kvmesh.cluster.benchmarks.traces import TraceError
    from kvmesh.cluster.sim.plots import plot_report
    from kvmesh.cluster.sim.replica import cut_trace
    from kvmesh.cluster.sim.report import format_table, write_json
    from kvmesh.cluster.sim.router import available_policies
    from kvmesh.cluster.sim.run import compare_policies

    try:
        config = build_config(args)
        records = load_workload(args)
        records = cut_trace(records, args.start, args.limit, args.max_prompt_blocks)
        registered = available_policies()
        policies = [p.strip() for p in args.policies.split(",") if p.strip()] if args.policies else registered
        unknown = [p for p in policies if p not in registered]
        if unknown:
            raise ValueError(f"unknown policies {unknown}; registered: {registered}")
        report = compare_policies(records, config, policies, show_progress=not args.no_progress,
                                  with_ceilings=not args.no_ceilings, variants=variants(args))
    except (TraceError, ValueError) as e:
        print(f"kvmesh sim: {e}", file=sys.stderr)
        return 2
    written = [str(write_json(report, args.out))]
    if not args.no_plot:
        written.append(str(plot_report(report, args.plot or Path(args.out).with_suffix(".png"))))
    print(format_table(report))
    print("wrote " + " and ".join(written))
    return 0
