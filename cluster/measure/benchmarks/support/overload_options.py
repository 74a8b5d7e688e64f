"""The options of ``kvmesh bench overload`` (benchmarks/overload.py): the cluster it starts or drives, its tenants
and their priorities, and the length and load of each phase.
"""

from __future__ import annotations

import argparse
import sys

from kvmesh.cluster.measure.shared_dir import stories_model


def build_parser(description: str | None) -> argparse.ArgumentParser:
    """The bench's options, by group (cluster; tenants and priorities; phases); ``description``: its help text."""
    ap = argparse.ArgumentParser(prog="kvmesh bench overload", description=description, allow_abbrev=False,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    c = ap.add_argument_group("cluster")
    c.add_argument("--url", default=None, help="drive this running router instead of starting a cluster")
    c.add_argument("--model", default=str(stories_model()), help="the replicas' model (default: stories260K)")
    c.add_argument("--replicas", type=int, default=1, help="replicas, each role both")
    c.add_argument("--pd", action="store_true", help="a P/D split: one prefill and one decode replica")
    c.add_argument("--workers", type=int, default=1, help="router processes (router --workers)")
    c.add_argument("--max-num-seqs", type=int, default=4)
    c.add_argument("--kvmesh-cmd", default=f"{sys.executable} -m kvmesh.cluster.cli",
                   help="the command that starts replicas and the router (another build's, to compare)")
    c.add_argument("--scheduling-policy", choices=["priority", "fcfs", "none"], default="priority",
                   help="the replicas' --scheduling-policy (priority: the bench's priorities reach their schedulers; "
                        "a replica under fcfs answers a non-zero priority 400, as vLLM; none: the flag is not passed, "
                        "for builds without it)")
    c.add_argument("--replica-arg", action="append", default=[], metavar="ARG",
                   help="extra flag for every replica (repeatable; e.g. --replica-arg=--scheduling-policy=priority)")
    c.add_argument("--router-arg", action="append", default=[], metavar="ARG",
                   help="extra flag for the router (repeatable)")
    t = ap.add_argument_group("tenants and priorities")
    t.add_argument("--light-user", default="light")
    t.add_argument("--flood-user", default="flood")
    t.add_argument("--high-user", default="vip")
    t.add_argument("--tenant-key", action="append", default=[], metavar="USER=KEY",
                   help="send this Bearer key with the tenant's requests (repeatable)")
    t.add_argument("--keys-file", default=None, help="YAML/JSON: {user: key} or a list of {key, tenant|name}")
    t.add_argument("--priority-in", choices=["body", "header", "both", "none"], default="body",
                   help="where a priority goes: the body's priority field (vLLM's), a header, both, or nowhere")
    t.add_argument("--priority-header", default="x-kvmesh-priority")
    t.add_argument("--high-priority", type=int, default=-1, help="the high class's priority (lower first)")
    t.add_argument("--low-priority", type=int, default=1, help="the bulk's priority in the overload phase")
    p = ap.add_argument_group("phases")
    p.add_argument("--light-period-s", type=float, default=2.0)
    p.add_argument("--light-tokens", type=int, default=16)
    p.add_argument("--alone-s", type=float, default=16.0)
    p.add_argument("--flood-s", type=float, default=25.0)
    p.add_argument("--flood-clients", type=int, default=48)
    p.add_argument("--flood-tokens", type=int, default=64)
    p.add_argument("--retry-after-cap-s", type=float, default=1.0, help="longest Retry-After a flood client honours")
    p.add_argument("--levels", default="2,4", help="overload levels, times the capacity (comma-separated)")
    p.add_argument("--capacity", type=float, default=None, help="requests/s at saturation (default: the flood's)")
    p.add_argument("--overload-s", type=float, default=12.0, help="seconds per overload level")
    p.add_argument("--high-share", type=float, default=0.1, help="share of overload arrivals in the high class")
    p.add_argument("--high-target-s", type=float, default=0.5, help="the high class's TTFT target (p90)")
    p.add_argument("--max-in-flight", type=int, default=256,
                   help="the driver's cap on requests in flight: bulk arrivals past it are not sent (the high class "
                        "always is: its clients are others)")
    p.add_argument("--drain-s", type=float, default=5.0, help="grace after an open-loop phase before cancelling")
    p.add_argument("--client-timeout-s", type=float, default=30.0, help="a request's whole time limit")
    p.add_argument("--settle-s", type=float, default=2.0,
                   help="with --url: seconds to wait between phases (a started cluster is polled until idle)")
    p.add_argument("--progress-s", type=float, default=5.0, help="seconds between progress lines (0: none)")
    ap.add_argument("--out", default=None, help="results JSON (default: results/bench_overload[_variant].json)")
    return ap
