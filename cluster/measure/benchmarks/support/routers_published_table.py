"""The table of N routers that share no memory, each seeing the load the replicas publish (``kvmesh sim --routers
1,4,16 --published-loads``), against one router, over arrival seeds: one results file per seed.

A row per router count: hit rate and mean TTFT (mean over the seeds), and each seed's difference from one router
on the same arrivals (mean, its 95% interval over the seeds, and the worst seed): a mean difference within
``HIT_POINTS`` points of hit rate and ``TTFT_SHARE`` of mean TTFT is the bar the row is held to.
"""

from __future__ import annotations

from statistics import mean

from kvmesh.cluster.measure.loadgen.intervals import interval

__all__ = ["HIT_POINTS", "TTFT_SHARE", "table"]

HIT_POINTS = 0.5
"""Points of hit rate N routers may lose against one."""
TTFT_SHARE = 0.02
"""Share of mean TTFT N routers may add against one."""


def _runs(doc: dict) -> dict[int, dict]:
    """Router count -> its run's summary."""
    return {p["num_routers"]: p for p in doc["policies"].values()}


def _lag(config: dict) -> str:
    every, lag = config["load_publish_interval_s"], config["load_publish_lag_s"]
    return (f"a request it accepted published at once and a step's change within {every * 1e3:.0f} ms, read "
            f"{lag * 1e3:.0f} ms later")


def table(docs: list[dict]) -> str:
    """The seeds' reports (each with the runs of every router count, ``published_loads`` on) as one table."""
    for doc in docs:
        if not doc["config"].get("published_loads"):
            raise ValueError("a report without --published-loads among the published-load runs; re-run its command")
    counts = sorted(_runs(docs[0]))
    if counts[0] != 1:
        raise ValueError("the published-load runs need --routers 1,... (one router is what N are compared with)")
    out = [f"| routers ({len(docs)} arrival seeds) | hit rate | vs 1 router [95% interval] (worst seed) | mean TTFT "
           "| vs 1 router [95% interval] (worst seed) | TTFT p99 | within 0.5 points and 2% |",
           "|---|---|---|---|---|---|---|"]
    for n in counts:
        runs = [(_runs(d)[n], _runs(d)[1]) for d in docs]
        hits = [(r["hit_rate"] - one["hit_rate"]) * 100 for r, one in runs]
        ttfts = [r["ttft_s"]["mean"] / one["ttft_s"]["mean"] - 1 for r, one in runs]
        hit, ttft = mean(r["hit_rate"] for r, _ in runs), mean(r["ttft_s"]["mean"] for r, _ in runs)
        p99 = mean(r["ttft_s"]["p99"] for r, _ in runs)
        if n == 1:
            out.append(f"| 1 | {hit:.1%} | | {ttft:.3f} s | | {p99:.2f} s | |")
            continue
        ok = mean(hits) >= -HIT_POINTS and mean(ttfts) <= TTFT_SHARE
        (dh, hh), (dt, ht) = interval(hits), interval([t * 100 for t in ttfts])
        out.append(f"| {n} | {hit:.1%} | {dh:+.2f} pt [{dh - hh:+.2f}, {dh + hh:+.2f}] ({min(hits):+.2f}) | {ttft:.3f} "
                   f"s "
                   f"| {dt:+.1f}% [{dt - ht:+.1f}, {dt + ht:+.1f}] ({max(ttfts):+.1%}) | {p99:.2f} s "
                   f"| {'yes' if ok else 'no'} |")
    out.append(f"\nEach router's view of a replica: {_lag(docs[0]['config'])}, plus its own requests the replica "
               "had not counted then.")
    return "\n".join(out)
