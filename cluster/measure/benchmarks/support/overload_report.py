"""The pure half of ``kvmesh bench overload``: percentiles, per-phase summaries, the acceptance verdict.

A request record (one dict per request sent, from support/overload_load.py) holds ``phase`` (alone, flood,
overload_2x, ...), ``cls`` (light, flood, high, bulk), ``t`` (send time, seconds since the run began),
``outcome`` (one of OUTCOMES), ``status`` (HTTP status or None), ``ttft_s`` (None without a first token),
``answer_s`` (seconds to the response's headers), ``retry_after`` (the header's value or None) and ``e2e_s``.
A request with no first token counts as an infinitely late one in its class's TTFT percentiles: a client
that got a 429, a timeout or nothing at all did not get its first token in time.
"""

from __future__ import annotations

import json
import math
from collections import Counter

OUTCOMES = ("ok", "429", "4xx", "5xx", "timeout", "error", "stream_error", "cancelled", "not_sent")
"""ok: 200 and a stream ending in [DONE]; 429; another 4xx; 5xx; timeout: the client's own limit; error: no
answer (refused, reset); stream_error: 200 but an error event or a broken stream; cancelled: still waiting when
its phase ended (the driver gave up on it); not_sent: the driver's in-flight cap was full at its arrival.
(``pending``, a request still under way, is only ever seen in progress lines and an interrupted run.)"""
FAST_429_S = 2.0
"""A shed request hears so within this many seconds."""
LIGHT_FLOOR_S = 0.5
"""The light tenant's TTFT p90 under the flood may be max(3 x its p50 alone, this)."""


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in [0, 1]) of ``values`` (may hold inf); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))]


def ttfts(records: list[dict]) -> list[float]:
    """Each request's TTFT, inf where it got no first token (not_sent records excluded: never asked)."""
    return [math.inf if r["ttft_s"] is None else r["ttft_s"] for r in records if r["outcome"] != "not_sent"]


def retry_after_ok(record: dict) -> bool:
    """A 429 that came within FAST_429_S and carried a ``Retry-After`` header."""
    return (record["outcome"] == "429" and record["retry_after"] is not None
            and record["answer_s"] is not None and record["answer_s"] <= FAST_429_S)


def summarize(records: list[dict]) -> dict:
    """One class in one phase: counts by outcome, TTFT percentiles (inf as None), 429 speed and headers."""
    t = ttfts(records)
    shed = [r for r in records if r["outcome"] == "429"]
    e2e = [r["e2e_s"] for r in records if r["outcome"] == "ok" and r["e2e_s"] is not None]
    return {
        "sent": sum(r["outcome"] != "not_sent" for r in records),
        "outcomes": dict(sorted(Counter(r["outcome"] for r in records).items())),
        "with_first_token": sum(r["ttft_s"] is not None for r in records),
        **{f"ttft_{name}_s": _finite(percentile(t, q)) for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))},
        "ttft_max_s": _finite(max(t, default=None)),
        "e2e_p50_s": percentile(e2e, 0.5),
        "shed_429": len(shed),
        "shed_429_fast_with_retry_after": sum(retry_after_ok(r) for r in shed),
        "shed_429_answer_p99_s": percentile([r["answer_s"] for r in shed if r["answer_s"] is not None], 0.99),
    }


def _finite(x: float | None) -> float | None:
    return None if x is None or math.isinf(x) else x


def by_phase_and_class(records: list[dict]) -> dict[str, dict[str, dict]]:
    """{phase: {cls: summarize(...)}} in the order phases and classes first appear."""
    groups: dict[str, dict[str, list[dict]]] = {}
    for r in records:
        groups.setdefault(r["phase"], {}).setdefault(r["cls"], []).append(r)
    return {phase: {cls: summarize(rs) for cls, rs in classes.items()} for phase, classes in groups.items()}


def _criterion(name: str, passed: bool, value, limit, detail: str) -> dict:
    return {"name": name, "pass": bool(passed), "value": value, "limit": limit, "detail": detail}


def verdict(records: list[dict], levels: list[float], high_target_s: float) -> dict:
    """The verdict, one criterion per line, from the request records alone."""
    pick = lambda phase, cls: [r for r in records if r["phase"] == phase and r["cls"] == cls]  # noqa: E731
    criteria = []
    alone_p50 = percentile(ttfts(pick("alone", "light")), 0.5)
    under = ttfts(pick("flood", "light"))
    p90 = percentile(under, 0.9)
    limit = None if alone_p50 is None or math.isinf(alone_p50) else max(3 * alone_p50, LIGHT_FLOOR_S)
    criteria.append(_criterion(
        "light_ttft_p90_under_flood", p90 is not None and limit is not None and p90 <= limit, _finite(p90), limit,
        f"light tenant TTFT p90 under the flood {_s(p90)} <= max(3 x p50 alone {_s(alone_p50)}, "
        f"{LIGHT_FLOOR_S} s) = {_s(limit)} ({len(under)} requests)"))
    flood = pick("flood", "flood")
    counts = Counter(r["outcome"] for r in flood)
    good = counts["ok"] + sum(retry_after_ok(r) for r in flood)
    bad_429 = counts["429"] - sum(retry_after_ok(r) for r in flood)
    criteria.append(_criterion(
        "flood_ends_200_or_fast_429", bool(flood) and good == len(flood), good, len(flood),
        f"{good}/{len(flood)} flood requests ended 200 or 429 within {FAST_429_S:g} s with Retry-After "
        f"(200: {counts['ok']}, 429: {counts['429']} of which slow or without Retry-After: {bad_429}, "
        f"other: {len(flood) - counts['ok'] - counts['429']})"))
    failed = counts["5xx"] + counts["timeout"] + counts["error"] + counts["stream_error"]
    criteria.append(_criterion(
        "flood_no_5xx_or_timeout", bool(flood) and failed == 0, failed, 0,
        f"5xx {counts['5xx']}, client timeouts {counts['timeout']}, connection errors {counts['error']}, "
        f"broken streams {counts['stream_error']}"))
    for level in levels:
        phase = level_phase(level)
        high = ttfts(pick(phase, "high"))
        hp90 = percentile(high, 0.9)
        got = sum(not math.isinf(x) for x in high)
        criteria.append(_criterion(
            f"high_priority_{level:g}x", hp90 is not None and hp90 <= high_target_s, _finite(hp90), high_target_s,
            f"high-priority TTFT p90 at {level:g}x overload {_s(hp90)} <= target {high_target_s:g} s "
            f"({got}/{len(high)} got a first token)"))
    return {"pass": all(c["pass"] for c in criteria), "criteria": criteria}


def level_phase(level: float) -> str:
    """The phase name of an overload level: overload_2x, overload_4x, overload_1.5x."""
    return f"overload_{level:g}x"


def _s(x: float | None) -> str:
    if x is None:
        return "n/a"
    return "never (no first token)" if math.isinf(x) else f"{x:.3f} s"


def format_verdict(v: dict) -> str:
    lines = [f"  {'PASS' if c['pass'] else 'FAIL'}  {c['name']}: {c['detail']}" for c in v["criteria"]]
    return "\n".join([f"acceptance: {'PASS' if v['pass'] else 'FAIL'}", *lines])


def format_table(phases: dict[str, dict[str, dict]]) -> str:
    """One line per phase and class: sent, outcomes, TTFT p50/p90/p99."""
    head = f"{'phase':<14}{'class':<7}{'sent':>6}  {'ttft p50':>9}{'p90':>9}{'p99':>9}  outcomes"
    rows = [head, "-" * len(head)]
    for phase, classes in phases.items():
        for cls, s in classes.items():
            cells = [_cell(s[f"ttft_{q}_s"], s["with_first_token"], s["sent"]) for q in ("p50", "p90", "p99")]
            outcomes = " ".join(f"{k}:{v}" for k, v in s["outcomes"].items())
            rows.append(f"{phase:<14}{cls:<7}{s['sent']:>6}  {cells[0]:>9}{cells[1]:>9}{cells[2]:>9}  {outcomes}")
    return "\n".join(rows)


def _cell(x: float | None, got: int, sent: int) -> str:
    if x is None:
        return "never" if sent and got < sent else "-"
    return f"{x:.3f}s"


COLUMNS = ("phase", "cls", "t", "outcome", "status", "ttft_s", "answer_s", "e2e_s", "retry_after", "tokens", "error")
"""A request record's fields, in the order the result file's rows hold them."""


def result_text(result: dict) -> str:
    """The result file's text: the summaries indented, then ``requests`` as ``columns`` and one compact row per
    request (a run sends thousands); ``load_result`` reads it back."""
    head = json.dumps({k: v for k, v in result.items() if k != "requests"}, indent=1)
    rows = ",\n".join("  " + json.dumps([r.get(c) for c in COLUMNS], separators=(",", ":"))
                       for r in result.get("requests", []))
    return (f'{head[:-2]},\n "requests": {{"columns": {json.dumps(list(COLUMNS))}, "rows": [\n{rows}\n ]}}\n}}\n')


def load_result(text: str) -> dict:
    """A result file as ``result_text`` wrote it, with ``requests`` as a list of records again."""
    doc = json.loads(text)
    table = doc.get("requests") or {"columns": COLUMNS, "rows": []}
    doc["requests"] = [dict(zip(table["columns"], row, strict=True)) for row in table["rows"]]
    return doc
