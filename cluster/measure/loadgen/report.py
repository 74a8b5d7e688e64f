"""Summaries of a load run: latency percentiles, throughput, errors, cached-token share; JSON output."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
from kvmesh.cluster.measure.loadgen.client import RequestResult


def percentiles(values, qs=(50, 90, 99)) -> dict[str, float | None]:
    vals = [v for v in values if v is not None]
    if not vals:
        return {f"p{q}": None for q in qs} | {"mean": None}
    arr = np.asarray(vals, dtype=float)
    return {f"p{q}": float(np.percentile(arr, q)) for q in qs} | {"mean": float(arr.mean())}


def summarize(results: list[RequestResult], wall_s: float, counters: dict | None = None) -> dict:
    ok = [r for r in results if r.ok]
    errors = [r for r in results if not r.ok]
    prompt = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    output = sum(r.completion_tokens for r in ok)
    kinds = Counter(r.error.split(":")[0] for r in errors)
    return {
        "requests": len(results),
        "ok": len(ok),
        "errors": len(errors),
        "error_kinds": dict(kinds),
        "error_samples": [r.error for r in errors[:5]],
        "duration_s": wall_s,
        "request_throughput": len(ok) / wall_s if wall_s > 0 else 0.0,
        "output_token_throughput": output / wall_s if wall_s > 0 else 0.0,
        "prompt_tokens": prompt,
        "completion_tokens": output,
        "cached_tokens": cached,
        "cached_token_share": cached / prompt if prompt else 0.0,
        "ttft_s": percentiles([r.ttft_s for r in ok]),
        "itl_s": percentiles([x for r in ok for x in r.itl_s]),
        "e2e_s": percentiles([r.e2e_s for r in ok]),
        **(counters or {}),
        **by_model(ok),
    }


def by_model(ok: list[RequestResult]) -> dict:
    """With requests naming several models (the ``lora`` workload's adapters): per model, its requests, its cached
    token share, the share of its requests after its first that found cached tokens, and its TTFT p50."""
    models: dict[str, list[RequestResult]] = {}
    for r in sorted(ok, key=lambda r: r.start_s):
        models.setdefault(r.model, []).append(r)
    if len(models) < 2:
        return {}
    out = {}
    for name, rs in sorted(models.items(), key=lambda kv: -len(kv[1])):
        prompt, later = sum(r.prompt_tokens for r in rs), rs[1:]
        out[name] = {"requests": len(rs),
                     "cached_token_share": sum(r.cached_tokens for r in rs) / prompt if prompt else 0.0,
                     "later_requests_cached": sum(r.cached_tokens > 0 for r in later) / len(later) if later else None,
                     "ttft_p50_s": percentiles([r.ttft_s for r in rs])["p50"]}
    return {"by_model": out}


def format_summary(label: str, s: dict) -> str:
    def ms(d, k):
        v = d.get(k)
        return "-" if v is None else f"{1000 * v:.1f}"

    return (f"{label}: {s['ok']}/{s['requests']} ok, {s['errors']} errors, {s['request_throughput']:.2f} req/s, "
            f"{s['output_token_throughput']:.1f} tok/s, cached {s['cached_token_share']:.1%} | "
            f"TTFT ms p50 {ms(s['ttft_s'], 'p50')} p90 {ms(s['ttft_s'], 'p90')} p99 {ms(s['ttft_s'], 'p99')} | "
            f"ITL ms p50 {ms(s['itl_s'], 'p50')} p99 {ms(s['itl_s'], 'p99')} | "
            f"E2E ms p50 {ms(s['e2e_s'], 'p50')} p99 {ms(s['e2e_s'], 'p99')}")


def write_json(data: dict, path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(data, indent=2) + "\n")
    return p
