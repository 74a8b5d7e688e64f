"""The live verdict's figures (``kvmesh bench live_verdict``'s results files): per router, the mean over the rounds
of the cached prompt share, mean / p50 / p99 TTFT, the mean end-to-end time, goodput (the share of requests whose
first token came within the workload's TTFT target) and the busiest replica's requests over the mean, each with its
95% interval; against kvmesh's router, the same round's differences (paired). Times and the target are in the
emulated GPU's time: the live figures divided by the fleet's time dilation. Beside them, the single pool's hit share
of the same requests (kvmesh's router's live ceiling, ``kvmesh_router_ceiling_hit_ratio``)."""

from __future__ import annotations

from kvmesh.cluster.measure.loadgen.intervals import interval, known_interval, plus_minus

REFERENCE = "kvmesh"
"""The router every other is compared with, round by round."""


def run_figures(row: dict, slo_s: float, dilation: float) -> dict[str, float | None]:
    """One run's figures in the emulated GPU's time; None where the run does not have them (Dynamo's arm: no replica
    counters, and only its router's mean TTFT)."""
    summary, counts = row["summary"], [r["requests"] for r in row["replicas"]]
    ttfts, ttft = row["ttft_s"], summary["ttft_s"]
    good = None if ttfts is None else sum(t is not None and t / dilation <= slo_s for t in ttfts) / len(ttfts)
    return {"hit_rate": summary["cached_token_share"], "ttft_mean_s": _undilated(ttft["mean"], dilation),
            "ttft_p50_s": _undilated(ttft["p50"], dilation), "ttft_p99_s": _undilated(ttft["p99"], dilation),
            "e2e_mean_s": _undilated(summary["e2e_s"]["mean"], dilation),
            "good_share": good, "busiest": max(counts) / (sum(counts) / len(counts)) if counts else None,
            "errors": summary["errors"]}


def _undilated(seconds: float | None, dilation: float) -> float | None:
    return None if seconds is None else seconds / dilation


def verdict_stats(result: dict) -> dict:
    """Per router: each figure's interval over the rounds, and the paired differences against kvmesh's router."""
    from kvmesh.cluster.measure.workloads.registry import ttft_slo_s

    fleet, (workload,) = result["fleet"], list(result["stats"])
    slo_s = ttft_slo_s(workload) or 1.0
    rows = sorted(result["rows"], key=lambda r: r["round"])
    runs = {n: [run_figures(r, slo_s, fleet["dilation"]) for r in rows if r["router"] == n]
            for n in result["stats"][workload]}
    ceilings = [r["ceiling"]["hit_rate"] for r in rows if "hit_rate" in r.get("ceiling", {})]
    out: dict = {"workload": workload, "slo_s": slo_s, "rate": fleet["rate"],
                 "ceiling": interval(ceilings) if ceilings else None, "routers": {}}
    ref = runs.get(REFERENCE)
    for name, figures in runs.items():
        entry = {k: known_interval([f[k] for f in figures])
                 for k in figures[0] if k != "errors"}
        entry["errors"] = sum(f["errors"] for f in figures)
        entry["rounds"] = len(figures)
        if ref is not None and name != REFERENCE and len(ref) == len(figures):
            pairs = list(zip(ref, figures, strict=True))
            entry["vs_reference"] = {
                "hit_points": _paired(pairs, "hit_rate", lambda a, b: 100 * (a - b)),
                "ttft_mean_ratio": _paired(pairs, "ttft_mean_s", lambda a, b: a / b - 1),
                "ttft_p99_ratio": _paired(pairs, "ttft_p99_s", lambda a, b: a / b - 1),
                "good_points": _paired(pairs, "good_share", lambda a, b: 100 * (a - b))}
        out["routers"][name] = entry
    return out


def _paired(pairs: list, key: str, diff) -> tuple[float, float] | None:
    """The interval of ``diff(kvmesh's, its)`` over the rounds; None where either lacks the figure."""
    return known_interval([None if a[key] is None or b[key] is None else diff(a[key], b[key]) for a, b in pairs])


def table(results: list[dict]) -> str:
    """A row per results file and router."""
    lines = ["| workload, rate | router | cached prompt tokens (single pool) | mean TTFT | TTFT p50 | TTFT p99 | "
             "mean end-to-end | goodput | busiest / mean | kvmesh minus it: cached (points) | "
             "kvmesh's mean TTFT / its - 1 | kvmesh minus it: goodput (points) |", "|---" * 12 + "|"]
    for result in results:
        v = verdict_stats(result)
        where = f"{v['workload']}, {v['rate']:g}/s"
        for name, s in v["routers"].items():
            vs = s.get("vs_reference")
            cells = [plus_minus(s["hit_rate"], "{:.1f}", 100, "%")
                     + (f" ({plus_minus(v['ceiling'], '{:.1f}', 100, '%')})"
                        if name == REFERENCE and v["ceiling"] else ""),
                     *(plus_minus(s[k], "{:.2f}", 1, " s") for k in ("ttft_mean_s", "ttft_p50_s", "ttft_p99_s",
                                                                      "e2e_mean_s")),
                     plus_minus(s["good_share"], "{:.0f}", 100, "%"), plus_minus(s["busiest"], "{:.2f}"),
                     *((plus_minus(vs["hit_points"], "{:+.1f}"), plus_minus(vs["ttft_mean_ratio"], "{:+.0f}", 100, "%"),
                        plus_minus(vs["good_points"], "{:+.1f}")) if vs else ("-",) * 3)]
            lines.append(f"| {where} | {'**' + name + '**' if name == REFERENCE else name} | {' | '.join(cells)} |")
    return "\n".join(lines)

