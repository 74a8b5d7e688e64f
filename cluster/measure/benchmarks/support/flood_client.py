"""The flood benchmark's client side (flood.py): what it sends through the router and what it sees there.

``FloodClient`` sends completions one at a time (a shared prefix plus a fresh suffix, with the route receipt);
``phase`` sends them for a while, sampling the router's RSS and, through ``Watch``, what the router says of
the honest replica; ``follow_ups`` checks that prompts the honest replica answered are still routed for
its cache; ``summarize`` and ``latency_buckets`` make the per-phase numbers and the plotted series.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import time

from kvmesh.cluster.measure.benchmarks.support import json_http
from kvmesh.cluster.measure.benchmarks.support.flooder import BLOCK_SIZE, VOCAB, prefixes

SUFFIX_TOKENS = 16


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class FloodClient:
    """One keep-alive connection to the router; completions one at a time."""

    def __init__(self, url: str) -> None:
        host, port = url.rsplit("/", 1)[1].split(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=30)
        self.rng = random.Random(1)
        self.prefixes = prefixes()

    def request(self, ids: list[int] | None = None) -> dict:
        """One completion (``ids``: its prompt; default a shared prefix + a fresh suffix), with the route receipt."""
        if ids is None:
            ids = self.rng.choice(self.prefixes) + [self.rng.randrange(1, VOCAB) for _ in range(SUFFIX_TOKENS)]
        body = json.dumps({"prompt": ids, "max_tokens": 1})
        t0 = time.perf_counter()
        self.conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json",
                                                              "x-kvmesh-receipt": "1"})
        r = self.conn.getresponse()
        data = r.read()
        ms = 1e3 * (time.perf_counter() - t0)
        ok = r.status == 200
        cached = json.loads(data)["usage"]["prompt_tokens_details"]["cached_tokens"] if ok else 0
        return {"t": time.monotonic(), "ms": ms, "ok": ok, "cached": cached, "tokens": len(ids), "ids": ids,
                "replica": r.getheader("x-kvmesh-replica"), "reason": r.getheader("x-kvmesh-route-reason")}


class Watch:
    """What the router says of the honest replica, every ``interval_s``: degraded or not (``/health``) and
    the lag of its last applied batch (``/metrics``)."""

    def __init__(self, url: str, replica: str = "healthy", interval_s: float = 0.5) -> None:
        self.url, self.replica, self.interval_s = url, replica, interval_s
        self.samples: list[dict] = []
        self._next = 0.0

    def maybe_sample(self, now: float) -> None:
        if now < self._next:
            return
        self._next = now + self.interval_s
        _, health = get(self.url, "/health")
        _, metrics = get(self.url, "/metrics")
        lag = None
        needle = f'kvmesh_router_event_lag_last_seconds{{replica="{self.replica}"}}'
        for line in metrics.splitlines():
            if line.startswith(needle):
                lag = float(line.rsplit(" ", 1)[1])
        degraded = json.loads(health).get("degraded_replicas", {})
        self.samples.append({"t": now, "lag_s": lag, "degraded": degraded.get(self.replica),
                             "others_degraded": sorted(set(degraded) - {self.replica})})

    def summary(self, since: float) -> dict:
        s = [x for x in self.samples if x["t"] >= since]
        lags = [x["lag_s"] for x in s if x["lag_s"] is not None]
        return {"samples": len(s), "lag_max_s": max(lags) if lags else None,
                "degraded_samples": sum(x["degraded"] is not None for x in s),
                "degraded_reasons": sorted({x["degraded"] for x in s if x["degraded"] is not None}),
                "others_degraded": sorted({r for x in s for r in x["others_degraded"]})}


def phase(client: FloodClient, seconds: float, rss_pid: int, samples: list, rss_cap_mb: float,
           watch: Watch) -> list[dict]:
    """Requests for ``seconds`` while sampling the router's RSS and its word on the honest replica; stops
    early past ``rss_cap_mb`` (a router without the bounds would take the machine down)."""
    out, end, next_sample = [], time.monotonic() + seconds, 0.0
    while (now := time.monotonic()) < end:
        watch.maybe_sample(now)
        if now >= next_sample:
            samples.append((now, rss_mb(rss_pid)))
            next_sample = now + 0.25
            if samples[-1][1] > rss_cap_mb:
                print(f"  router RSS {samples[-1][1]:.0f} MB > {rss_cap_mb:.0f} MB: flood stopped", flush=True)
                break
        out.append(client.request())
    samples.append((time.monotonic(), rss_mb(rss_pid)))
    return out


def summarize(reqs: list[dict]) -> dict:
    ms = sorted(r["ms"] for r in reqs)
    pct = lambda q: ms[min(len(ms) - 1, int(q * len(ms)))] if ms else float("nan")  # noqa: E731
    routes: dict[str, int] = {}
    for r in reqs:
        key = f"{r['reason']}:{r['replica']}"
        routes[key] = routes.get(key, 0) + 1
    return {"requests": len(reqs), "errors": sum(not r["ok"] for r in reqs), "routes": routes,
            "hit_rate": sum(r["cached"] for r in reqs) / max(1, sum(r["tokens"] for r in reqs)),
            "latency_p50_ms": pct(0.5), "latency_p99_ms": pct(0.99), "latency_max_ms": ms[-1] if ms else None}


def follow_ups(client: FloodClient, earlier: list[dict], n: int = 6) -> dict:
    """``n`` follow-ups, each an earlier prompt the honest replica answered plus 16 fresh tokens: routed
    for the cache ("cache" to "healthy") and given it (cached >= the earlier prompt's full blocks)?"""
    base = [r for r in earlier if r["ok"] and r["replica"] == "healthy"][-n:]
    got = []
    for r in base:
        ids = r["ids"] + [client.rng.randrange(1, VOCAB) for _ in range(SUFFIX_TOKENS)]
        f = client.request(ids)
        f["expected_cached"] = len(r["ids"]) // BLOCK_SIZE * BLOCK_SIZE
        got.append(f)
    return {"sent": len(got),
            "routed_for_cache": sum(f["reason"] == "cache" and f["replica"] == "healthy" for f in got),
            "got_cache": sum(f["cached"] >= f["expected_cached"] for f in got),
            "each": [{k: f[k] for k in ("replica", "reason", "cached", "expected_cached")} for f in got]}


def get(url: str, path: str) -> tuple[int, str]:
    """GET ``url + path``: its status and body (an HTTP error's too)."""
    answer = json_http.get(url + path, timeout=10)
    return answer.status, answer.text


def latency_buckets(points: list[tuple[float, float]], width_s: float = 0.25) -> list[tuple]:
    """``(t, ms)`` points -> one ``(t, p50_ms, max_ms, n)`` per ``width_s`` window (the JSON stays small)."""
    buckets: dict[int, list[float]] = {}
    for t, ms in points:
        buckets.setdefault(int(t // width_s), []).append(ms)
    return [(round(k * width_s, 3), round(sorted(v)[len(v) // 2], 2), round(max(v), 2), len(v))
            for k, v in sorted(buckets.items())]
