"""The live verdict's time between tokens (``kvmesh bench live_verdict``'s results files), the figure behind its
end-to-end column: per router, the time between a request's streamed tokens at the median, p90 and p99 (a decode that
shares its step with a prefill chunk waits what the chunk costs). Means over the rounds with their 95% intervals, in the
emulated GPU's time; "-" where an arm's client does not see them (Dynamo's stream carries no text until its end).
Beside them, the emulated replicas' own timing: one whole prefill of the longest prompt on an idle replica, how late
the steps ended (the worst replica at p99) and the CPU a step cost."""

from __future__ import annotations

import math

from kvmesh.cluster.measure.loadgen.intervals import known_interval, plus_minus

QUANTILES = ("p50", "p90", "p99")


def whole_prefill_s(fleet: dict, max_prompt_tokens: int) -> float:
    """The GPU's time for one prompt of ``max_prompt_tokens`` on an idle replica of the fleet's profile (its cost
    model and step budget, as the results file records them): its tokens' prefill and each chunk's step overhead."""
    cost, steps = fleet["cost"], math.ceil(max_prompt_tokens / fleet["max_num_batched_tokens"])
    return max_prompt_tokens * cost["prefill_s_per_token"] + steps * cost["step_overhead_s"]


def round_itl(row: dict, dilation: float) -> dict[str, float | None]:
    """One run's time between tokens at p50, p90 and p99 in the GPU's time; None where the client has no per-request
    times."""
    itl = row["summary"].get("itl_s") or {}
    if row.get("ttft_s") is None:
        return dict.fromkeys(QUANTILES)
    return {q: None if itl.get(q) is None else itl[q] / dilation for q in QUANTILES}


def table(results: list[dict]) -> str:
    """A row per results file and router; then a row per file of the replicas' own timing."""
    lines = ["| workload, rate | router | time between tokens p50 | p90 | p99 |", "|---|---|---|---|---|"]
    timing = []
    for result in results:
        fleet, settings = result["fleet"], result["settings"]
        where, dilation = f"{settings['workload']}, {fleet['rate']:g}/s", fleet["dilation"]
        runs: dict[str, list[dict]] = {}
        for row in sorted(result["rows"], key=lambda r: r["round"]):
            runs.setdefault(row["router"], []).append(round_itl(row, dilation))
        for name, figures in runs.items():
            p50, p90, p99 = (known_interval([f[q] for f in figures]) for q in QUANTILES)
            lines.append(f"| {where} | {name} | {plus_minus(p50, '{:.0f}', 1e3, ' ms')} | "
                         f"{plus_minus(p90, '{:.0f}', 1e3, ' ms')} | {plus_minus(p99, '{:.2f}', 1, ' s')} |")
        emulation = fleet["emulation"]
        late, cpu = max(e["late_s_p99"] for e in emulation), [e["cpu_s_per_step"] for e in emulation]
        timing.append(f"| {where} | {whole_prefill_s(fleet, settings['max_prompt_tokens']):.2f} s | "
                      f"{1e3 * max(e['late_s_p50'] for e in emulation):.1f} ms | {1e3 * late:.1f} ms | "
                      f"{1e3 * late / dilation:.1f} ms | {1e3 * min(cpu):.2f}-{1e3 * max(cpu):.2f} ms |")
    head = ["| workload, rate | one whole prefill of the longest prompt | steps late, p50 (worst replica) | p99 | "
            "p99 in the GPU's time | CPU per step |", "|---|---|---|---|---|---|"]
    return "\n".join(lines) + "\n\n" + "\n".join(head + timing)
