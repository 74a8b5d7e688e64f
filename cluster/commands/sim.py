"""``kvmesh sim``: compare routing policies on a trace with simulated replicas (see kvmesh.cluster.measure.sim)."""

from __future__ import annotations

import argparse
import sys
import textwrap
from dataclasses import fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

from kvmesh.cluster.measure.sim.options import SESSION_MODES, SimCommandConfig, SimWorkloadOptions

if TYPE_CHECKING:
    from kvmesh.cluster.measure.sim.config import SimConfig
    from kvmesh.cluster.measure.workloads.settings import WorkloadShape
    from kvmesh.cluster.measure.workloads.traces import MooncakeRecord


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return values


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from kvmesh.cluster.config.flags import add_config_arguments
    from kvmesh.cluster.measure.sim.options import SIM_SCHEMA
    from kvmesh.cluster.measure.workloads.registry import describe

    p = subparsers.add_parser(
        "sim", help="replay a trace through the real router in front of simulated replicas",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=describe(),
        description=textwrap.fill(
            "Replay a workload (a Mooncake hash_ids trace by default) through the real router index and policies "
            "in front of N simulated replicas (real kvcache block pools, model time from a cost model), and "
            "compare policies: prefix hit rate vs. infinite-cache and single-pool ceilings, TTFT and "
            "queueing p50/p99, load imbalance, events/s. Writes JSON + a PNG plot. "
            "`kvmesh sim scaling --help`: an autoscaled fleet against a fixed one over a varying rate.", 100))
    add_config_arguments(p, SIM_SCHEMA, config_file=False)
    r = p.add_argument_group("runs and output")
    r.add_argument("--routers", type=_int_list, default=[1], metavar="N[,N...]",
                   help="independent routers with requests spread over them; a list (1,4) runs each "
                        "policy once per count (default: 1; with several, --load-poll-s defaults to 0.5)")
    r.add_argument("--out", default="results/sim.json", help="JSON report path (default: %(default)s)")
    r.add_argument("--plot", default=None, help="PNG path (default: the JSON path with .png)")
    r.add_argument("--no-plot", action="store_true", help="write no PNG")
    r.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run)


def build_config(command: SimCommandConfig, routers: list[int], load_poll_given: bool) -> SimConfig:
    """The ``SimConfig`` of the first run: ``--cost`` applied, ``--routers``' first count, the load poll
    defaulting to 0.5 s with several routers, and ``--miniature``."""
    from kvmesh.cluster.measure.sim.config import CostModel, miniature

    known = {f.name for f in fields(CostModel)}
    for key in command.compare.cost:
        if key not in known:
            raise ValueError(f"--cost {key}: unknown CostModel field; choose from {sorted(known)}")
    sim = command.sim
    load_poll_s = sim.load_poll_s if load_poll_given else (0.5 if max(routers) > 1 else 0.0)
    config = replace(sim, num_routers=routers[0], load_poll_s=load_poll_s,
                     cost=CostModel(**{k: float(v) for k, v in command.compare.cost.items()}))
    return miniature(config, command.compare.miniature)


def variants(routers: list[int], sessions: str, kv_transfer: dict[str, dict] | None = None,
             adapters: dict[str, dict] | None = None) -> dict[str, dict] | None:
    """Label suffix -> SimConfig changes, one run per entry and policy (None: one plain run); ``kv_transfer``:
    the ``--pd-compare`` runs (``run.kv_transfer_variants``), and ``adapters``: the ``--adapter-affinity both``
    runs (``lora_variants``), crossed with the others."""
    counts: list[int | None] = list(routers) if len(routers) > 1 else [None]
    out = {}
    for n in counts:
        for suffix, on in SESSION_MODES[sessions].items():
            label = (f"/{n}r" if n is not None else "") + suffix.strip()
            out[label] = {"use_sessions": on} | ({"num_routers": n} if n is not None else {})
    for more_runs in (kv_transfer, adapters):
        if more_runs:
            out = {label + suffix: changes | more for label, changes in out.items()
                   for suffix, more in more_runs.items()}
    return out if len(out) > 1 or sessions != "off" else None


def lora_variants(config: SimConfig, mode: str) -> dict[str, dict] | None:
    """``--adapter-affinity``: label suffix -> the run's LoRA section (None: ``on``, the config as given)."""
    from kvmesh.cluster.measure.sim.lora_config import ADAPTER_AFFINITY_MODES

    if mode == "on":
        return None
    return {suffix: {"lora": replace(config.lora, adapter_aware=aware)}
            for suffix, aware in ADAPTER_AFFINITY_MODES[mode].items()}


def load_workload(workload: SimWorkloadOptions, shape: WorkloadShape, seed: int) -> list[MooncakeRecord]:
    """The records of the registered ``--workload`` (or ``--synthetic``), bursty if asked."""
    from kvmesh.cluster.measure.workloads.generated import bursty
    from kvmesh.cluster.measure.workloads.registry import get_workload

    entry = get_workload("multi_turn" if workload.synthetic else workload.workload)
    records = entry.make(workload.settings(seed, shape))
    if workload.burst:
        records = bursty(records, workload.burst, workload.burst_duty, workload.burst_period)
    return records


def load_replication(workload: SimWorkloadOptions, shape: WorkloadShape, seed: int,
                     time_scale: float = 1.0) -> tuple[list[MooncakeRecord], str | None]:
    """The records to simulate, windowed (``cut_trace``), and with ``--arrival-seed`` the replication's arrivals
    and the line saying how they were drawn (None without it: the records as they are). ``time_scale``: the replay's
    (a fan-out's width is the replay's milliseconds)."""
    from kvmesh.cluster.measure.sim.replica import cut_trace
    from kvmesh.cluster.measure.workloads.arrivals import fan_out, on_clock, redraw_seed, shuffle_ticks, spread_arrivals
    from kvmesh.cluster.measure.workloads.registry import get_workload

    clock = workload.arrival_clock_ms

    def window(records: list[MooncakeRecord]) -> list[MooncakeRecord]:
        records = cut_trace(records, workload.start, workload.limit, workload.max_prompt_blocks)
        return records if clock is None else on_clock(records, clock)

    k = workload.arrival_seed
    if k is None:
        return window(load_workload(workload, shape, seed)), None
    redrawn = workload.synthetic or get_workload(workload.workload).trace_file is None
    records = window(load_workload(workload, shape, redraw_seed(seed, k) if redrawn else seed))
    if redrawn and clock is None:
        return records, f"arrival seed {k}: the generated workload redrawn (its seed {redraw_seed(seed, k)})"
    if workload.arrival_spread == "order":
        moved, line = shuffle_ticks(records, k)
    elif workload.arrival_spread == "fanout":
        moved, line = fan_out(records, k, workload.fanout_ms / time_scale, workload.fanout_ms)
    else:
        moved, line = spread_arrivals(records, k, clock)
    return moved, f"{line} (the generated workload redrawn)" if redrawn else line


def run(args: argparse.Namespace) -> int:
    from kvmesh.cluster.config.flags import config_from_args, overrides_from_args
    from kvmesh.cluster.measure.sim.lora_report import format_lora_table, has_lora, plot_lora
    from kvmesh.cluster.measure.sim.options import SIM_SCHEMA
    from kvmesh.cluster.measure.sim.plots import plot_kv_transfer, plot_report
    from kvmesh.cluster.measure.sim.report import format_table, write_json
    from kvmesh.cluster.measure.sim.router import available_policies, default_policies
    from kvmesh.cluster.measure.sim.run import compare_policies, kv_transfer_variants
    from kvmesh.cluster.measure.workloads.registry import ttft_slo_s
    from kvmesh.cluster.measure.workloads.traces import TraceError

    try:
        command: SimCommandConfig = config_from_args(args, SIM_SCHEMA)
        w, compare = command.workload, command.compare
        config = build_config(command, args.routers, "sim.load_poll_s" in overrides_from_args(args, SIM_SCHEMA))
        records, arrivals = load_replication(w, command.shape, config.seed, config.time_scale)
        registered = available_policies()
        policies = [p.strip() for p in compare.policies.split(",") if p.strip()] if compare.policies else \
            default_policies()
        unknown = [p for p in policies if p not in registered]
        if unknown:
            raise ValueError(f"unknown policies {unknown}; registered: {registered}")
        moves = kv_transfer_variants(config) if compare.pd_compare else None
        report = compare_policies(records, config, policies, show_progress=not args.no_progress,
                                  with_ceilings=compare.ceilings,
                                  variants=variants(args.routers, compare.sessions, moves,
                                                                    lora_variants(config, compare.adapter_affinity)),
                                  ttft_slo_s=ttft_slo_s("multi_turn" if w.synthetic else w.workload))
    except (TraceError, ValueError) as e:
        print(f"kvmesh sim: {e}", file=sys.stderr)
        return 2
    if arrivals is not None:
        report["trace"]["arrivals"] = arrivals
    written = [str(write_json(report, args.out))]
    if not args.no_plot:
        png = Path(args.plot or Path(args.out).with_suffix(".png"))
        written.append(str(plot_report(report, png)))
        if config.num_prefill_replicas or config.peer_pulls or compare.pd_compare:
            written.append(str(plot_kv_transfer(report, png.with_name(png.stem + "_kv_transfer.png"))))
    if arrivals is not None:
        print(arrivals)
    print(format_table(report))
    if has_lora(report):
        print(format_lora_table(report))
        if not args.no_plot:
            written.append(str(plot_lora(report, png.with_name(png.stem + "_lora.png"))))
    print("wrote " + " and ".join(written))
    return 0
