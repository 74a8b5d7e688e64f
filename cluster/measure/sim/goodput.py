"""Goodput: requests that met their latency targets, per second of offered traffic (DistServe's
measure). A request is *good* when it was served (not shed by the router's admission), its time to first token
is at most its ``ttft_target_s`` and its mean inter-token time (TPOT: seconds from first to last token over the
tokens after the first) at most its ``itl_target_s``; a missing target is met. Reported for the whole run, per
tenant and per priority, beside the shed rate and TTFT percentiles of what was served.

The rate divides by the arrival window (first to last arrival): the same for every run of one workload, so runs
with and without admission compare on the traffic offered, not on how long their queues took to drain.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvmesh.cluster.measure.sim.request import SimRequest
from kvmesh.cluster.measure.sim.stats import percentiles
from kvmesh.cluster.measure.workloads.tenants import TenantClass


def label_requests(requests: Sequence[SimRequest], classes: Sequence[TenantClass]) -> None:
    """Give each request its class's tenant, priority and targets (``classes[i]`` belongs to ``requests[i]``)."""
    if len(classes) != len(requests):
        raise ValueError(f"{len(classes)} tenant classes for {len(requests)} requests")
    for req, cls in zip(requests, classes, strict=True):
        req.tenant, req.priority = cls.name, cls.priority
        req.ttft_target_s, req.itl_target_s = cls.ttft_s, cls.itl_s


def ttft_s(req: SimRequest) -> float:
    """Seconds from arrival (at the router) to the first token."""
    return req.first_token_s - req.arrival_s


def tpot_s(req: SimRequest) -> float:
    """Mean seconds between output tokens after the first (0 for a one-token answer)."""
    if req.num_output_tokens <= 1:
        return 0.0
    return (req.finished_s - req.first_token_s) / (req.num_output_tokens - 1)


def is_good(req: SimRequest) -> bool:
    """Served, and within both of its targets."""
    if req.shed_reason is not None or req.finished_s < 0:
        return False
    return ((req.ttft_target_s is None or ttft_s(req) <= req.ttft_target_s)
            and (req.itl_target_s is None or tpot_s(req) <= req.itl_target_s))


def ttft_slo_summary(requests: Sequence[SimRequest], slo_s: float) -> dict:
    """The share of the offered requests served with a TTFT of at most ``slo_s`` (shed ones count as missed)."""
    good = sum(1 for r in requests if r.shed_reason is None and r.finished_s >= 0 and ttft_s(r) <= slo_s)
    return {"slo_s": slo_s, "good_share": good / len(requests) if requests else 0.0}


def arrival_window_s(requests: Sequence[SimRequest]) -> float:
    """First to last arrival (1 s when they all arrive at once, so a rate stays a count)."""
    if not requests:
        return 1.0
    span = max(r.arrival_s for r in requests) - min(r.arrival_s for r in requests)
    return span if span > 0 else 1.0


def _group(requests: Sequence[SimRequest], window_s: float) -> dict:
    served = [r for r in requests if r.shed_reason is None]
    good = sum(map(is_good, requests))
    shed: dict[str, int] = {}
    for r in requests:
        if r.shed_reason is not None:
            shed[r.shed_reason] = shed.get(r.shed_reason, 0) + 1
    n = len(requests)
    return {
        "requests": n,
        "served": len(served),
        "good": good,
        "good_rate": good / n if n else 0.0,
        "goodput_rps": good / window_s,
        "shed": n - len(served),
        "shed_rate": (n - len(served)) / n if n else 0.0,
        "shed_reasons": shed,
        "ttft_s": percentiles([ttft_s(r) for r in served]),
        "tpot_s": percentiles([tpot_s(r) for r in served]),
    }


def goodput_summary(requests: Sequence[SimRequest]) -> dict:
    """The run's goodput, shed rate and served TTFT: overall, per tenant and per priority."""
    window = arrival_window_s(requests)
    tenants: dict[str, list[SimRequest]] = {}
    priorities: dict[int, list[SimRequest]] = {}
    for r in requests:
        tenants.setdefault(r.tenant or "-", []).append(r)
        priorities.setdefault(r.priority, []).append(r)
    return {
        "window_s": window,
        **_group(requests, window),
        "per_tenant": {name: _group(reqs, window) for name, reqs in sorted(tenants.items())},
        "per_priority": {str(p): _group(reqs, window) for p, reqs in sorted(priorities.items())},
    }


def has_targets(requests: Sequence[SimRequest]) -> bool:
    """Whether any request carries a tenant or a target (else goodput would just restate the throughput)."""
    return any(r.tenant is not None or r.ttft_target_s is not None or r.itl_target_s is not None
               or r.shed_reason is not None for r in requests)


def format_goodput_table(report: dict) -> str:
    """The runs' goodput lines: overall, then per priority (TTFT of the served, shed rate)."""
    runs = {name: s["goodput"] for name, s in report["policies"].items() if "goodput" in s}
    if not runs:
        return ""
    width = max([16, *(len(name) + 2 for name in runs)])
    header = (f"{'goodput':<{width}}{'class':>10}{'req':>7}{'good/s':>9}{'good':>7}{'shed':>7}"
              f"{'TTFT p50':>10}{'TTFT p99':>10}{'TPOT p50':>10}")
    lines = [header, "-" * len(header)]
    for name, g in runs.items():
        rows = [("all", g)] + [(f"prio {p}", v) for p, v in g["per_priority"].items()]
        rows += [(t, v) for t, v in g["per_tenant"].items()] if len(g["per_tenant"]) > 1 else []
        for label, v in rows:
            lines.append(f"{name if label == 'all' else '':<{width}}{label:>10}{v['requests']:>7}"
                         f"{v['goodput_rps']:>9.2f}{v['good_rate']:>7.0%}{v['shed_rate']:>7.0%}"
                         f"{v['ttft_s']['p50']:>10.3f}{v['ttft_s']['p99']:>10.3f}{v['tpot_s']['p50']:>10.4f}")
    return "\n".join(lines)
