"""The table of N routers that share no memory, each seeing the load the replicas publish (``kvmesh sim --routers
1,4,16 --published-loads``), with the other routers' choices told them a moment later (``--router-sync``), or each
seeing every other's choices at once (``--share-loads --share-predictions``: an ideal feed between the routers),
against one router, over arrival seeds: one results file per seed.

A row per router count: the hit rate as a share of the single pool's and the mean TTFT (means over the seeds), and
each seed's difference from one router on the same arrivals, with its 95% interval over the seeds
(support/paired_verdict.py): within ``HIT_SHARE`` (points of the pool's share) and ``TTFT_MEAN`` (of the mean TTFT)
is the bar, judged as the policy verdict judges: ``pass`` when the whole interval is within it, ``fail`` when the
whole interval is beyond, ``undecided`` when it straddles (more seeds, not a verdict).
"""

from __future__ import annotations

from statistics import mean

from kvmesh.cluster.measure.benchmarks.support.paired_verdict import Metric, judge, paired

__all__ = ["HIT_SHARE", "TTFT_MEAN", "table"]

HIT_SHARE = Metric("hit_share", "hit (of pool)", True, 0.01, True)
"""Points of the single pool's share N routers may lose against one (0.01: 1 point)."""
TTFT_MEAN = Metric("ttft_mean", "TTFT mean", False, 0.05, True)
"""Share of mean TTFT N routers may add against one (0.05: 5%)."""


def _runs(doc: dict) -> dict[int, dict]:
    """Router count -> its run's summary."""
    return {p["num_routers"]: p for p in doc["policies"].values()}


def _pool_share(doc: dict, run: dict) -> float:
    pool = doc.get("ceilings", {}).get("single_pool_hit_rate")
    if not pool:
        raise ValueError("a published-load report without the single pool's ceiling; re-run its command without "
                         "--no-ceilings")
    return run["hit_rate"] / pool


def _view(config: dict) -> str:
    """What each router sees of the others' requests on a replica."""
    if config.get("published_loads"):
        every, lag = config["load_publish_interval_s"], config["load_publish_lag_s"]
        told = 1e3 * config.get("sync_lag_s", 0.0)
        turn = 1e3 * (config.get("router_turn_s") or 0.0)
        turns = (f"; the routers take turns of {turn:g} ms to decide, each request waiting for its router's"
                 if turn else "")
        synced = (f", and the other routers' requests and the blocks they predicted there, told {told:g} ms after each "
                  f"was sent (router sync{turns})") if config.get("router_sync") else ""
        return (f"Each router's view of a replica: a request it accepted published at once and a step's change within "
                f"{every * 1e3:.0f} ms, read {lag * 1e3:.0f} ms later, plus its own requests the replica had not "
                f"counted then{synced}.")
    predictions = " and the blocks each predicted there" if config.get("share_predictions") else ""
    return (f"Each router's view of a replica: every router's requests sent there that have not finished{predictions}, "
            f"as each router chooses (a feed between the routers with no lag; the replicas publish nothing).")


def _row(docs: list[dict], n: int) -> str:
    """The row of ``n`` routers (one router's: the reference, no differences)."""
    runs = [(_runs(d)[n], _runs(d)[1], d) for d in docs]
    share = mean(_pool_share(d, r) for r, _, d in runs)
    ttft, p99 = mean(r["ttft_s"]["mean"] for r, _, _ in runs), mean(r["ttft_s"]["p99"] for r, _, _ in runs)
    if n == 1:
        return f"| 1 | {share:.1%} | | {ttft:.3f} s | | {p99:.2f} s | |"
    hit = paired(HIT_SHARE, [_pool_share(d, r) for r, _, d in runs], [_pool_share(d, o) for _, o, d in runs])
    time = paired(TTFT_MEAN, [r["ttft_s"]["mean"] for r, _, _ in runs], [o["ttft_s"]["mean"] for _, o, _ in runs])
    verdicts = {judge(HIT_SHARE, hit), judge(TTFT_MEAN, time)}
    verdict = "fail" if "fail" in verdicts else "undecided" if "undecided" in verdicts else "pass"
    return (f"| {n} | {share:.1%} | {hit.describe(HIT_SHARE)} | {ttft:.3f} s | {time.describe(TTFT_MEAN)} "
            f"| {p99:.2f} s | {verdict} |")


def table(docs: list[dict]) -> str:
    """The seeds' reports (each with the runs of every router count, ``published_loads`` on) as one table."""
    for doc in docs:
        if not (doc["config"].get("published_loads") or doc["config"].get("share_loads")):
            raise ValueError("a report with neither --published-loads nor --share-loads among the several-router "
                             "runs: its routers saw nothing of each other; re-run its command")
        if _view(doc["config"]) != _view(docs[0]["config"]):
            raise ValueError("the seeds' reports were run with different views of the other routers; one table, one "
                             "command")
    counts = sorted(_runs(docs[0]))
    if counts[0] != 1:
        raise ValueError("the published-load runs need --routers 1,... (one router is what N are compared with)")
    policies = sorted({r["policy"] for d in docs for r in d["policies"].values()})
    out = [f"| routers ({len(docs)} arrival seeds) | hit, share of the pool | vs 1 router [95% interval] "
           f"| mean TTFT | vs 1 router [95% interval] | TTFT p99 | within {100 * HIT_SHARE.margin:g} point and "
           f"{100 * TTFT_MEAN.margin:g}% |",
           "|---|---|---|---|---|---|---|"]
    out += [_row(docs, n) for n in counts]
    arrivals = docs[0].get("trace", {}).get("arrivals", "the trace's own arrivals")
    out.append(f"\nPolicy {', '.join(policies)}. {_view(docs[0]['config'])} Arrivals (first seed): {arrivals}.")
    return "\n".join(out)
