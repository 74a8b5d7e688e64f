"""``kvmesh bench soak``'s verdict arithmetic: memory growth from the warm-up mark to the end (medians of a window),
and every request's outcome classified (a well-formed one that failed, a hostile one that got anything but a clean
4xx)."""

from __future__ import annotations

import pytest
from kvmesh.cluster.measure.benchmarks.soak import table
from kvmesh.cluster.measure.benchmarks.support.soak_hostile import clean_refusal
from kvmesh.cluster.measure.benchmarks.support.soak_verdict import (
    FAILURES_KEPT,
    SoakTally,
    growth,
    trend_mb_per_10min,
    verdict,
)


def _samples(values: list[float], name: str = "router", every: float = 10.0) -> list[dict]:
    return [{"t": i * every, "rss_mb": {name: v}} for i, v in enumerate(values)]


def test_growth_is_from_the_median_at_the_warmup_mark_to_the_median_at_the_end():
    # t: 0 10 20 | 30 40 50 (the mark's window) | ... | 80 90 100 (the end's window)
    values = [50, 80, 95, 100, 400, 100, 104, 106, 108, 110, 109]
    got = growth(_samples(values), "router", warmup_s=30, window_s=20)
    assert got["at_warmup_mb"] == 100  # the median of 100, 400, 100: one spike moves nothing
    assert got["at_end_mb"] == 109  # the median of 108, 110, 109
    assert got["growth"] == pytest.approx(0.09)
    assert got["peak_after_warmup_mb"] == 400
    assert got["first_mb"] == 50  # what the warm-up itself took is not growth


def test_a_process_growing_past_the_bound_fails_the_verdict_and_one_within_passes():
    samples = [{"t": t, "rss_mb": {"router": 100 + t / 10, "replica-0": 200.0}} for t in range(0, 101, 5)]
    tally = SoakTally()
    tally.record("chat", None, 1.0)
    v = verdict(samples, ["router", "replica-0"], tally, warmup_s=10, window_s=0, max_growth=0.05, exited=[])
    assert v["processes"]["router"]["growth"] == pytest.approx(110 / 101 - 1, abs=1e-4)
    assert not v["processes"]["router"]["within"] and v["processes"]["replica-0"]["within"]
    assert not v["ok"]
    v = verdict(samples, ["router", "replica-0"], tally, warmup_s=10, window_s=0, max_growth=0.10, exited=[])
    assert v["ok"]


def test_no_sample_after_the_warmup_mark_is_an_error_not_a_pass():
    with pytest.raises(ValueError, match="no sample after the warm-up mark"):
        growth(_samples([100, 100]), "router", warmup_s=300, window_s=30)


def test_one_well_formed_failure_or_one_misanswered_hostile_request_or_an_exit_fails_the_run():
    samples = _samples([100.0] * 5)

    def run(*records, exited=()) -> bool:
        tally = SoakTally()
        for kind, reason, label in records:
            tally.record(kind, reason, 1.0, label)
        return verdict(samples, ["router"], tally, warmup_s=10, window_s=10, max_growth=0.1, exited=list(exited))["ok"]

    fine = ("chat", None, None)
    assert run(fine, ("hostile", None, "a list 10,000 deep"))
    assert not run(fine, ("tool_forced", "500: boom", None))
    assert not run(fine, ("hostile", "hostile answered 200: {}", "temperature NaN"))
    assert not run(fine, exited=["replica-1 exited with -9"])
    assert not run()  # nothing sent proves nothing


def test_the_tally_counts_by_kind_and_reason_and_keeps_the_first_failures_only():
    tally = SoakTally()
    for i in range(FAILURES_KEPT + 5):
        tally.record("json_schema", "500: compile failed", float(i))
    tally.record("hostile", "hostile answered 500: x", 3.0, "empty choice list")
    tally.record("hostile", None, 4.0, "empty choice list")
    got = tally.as_dict()
    assert got["by_kind"]["json_schema"] == {"sent": FAILURES_KEPT + 5, "ok": 0, "failed": FAILURES_KEPT + 5}
    assert got["by_kind"]["hostile"] == {"sent": 2, "ok": 1, "failed": 1}
    assert got["well_formed_failed"] == FAILURES_KEPT + 5 and got["hostile_misanswered"] == 1
    assert got["failure_reasons"]["json_schema: 500: compile failed"] == FAILURES_KEPT + 5
    assert got["failure_reasons"]["hostile (empty choice list): hostile answered 500: x"] == 1
    assert got["hostile_cases"] == {"empty choice list": 2}
    assert len(got["failures"]) == FAILURES_KEPT


@pytest.mark.parametrize(("status", "text", "ok"), [
    (400, '{"error": {"message": "bad", "type": "invalid_request_error"}}', True),
    (404, '{"error": {"message": "Response not found."}}', True),
    (200, '{"id": "chatcmpl-1"}', False),  # served what it should have refused
    (500, '{"error": {"message": "Internal Server Error"}}', False),
    (400, "Traceback (most recent call last): ...", False),  # a 4xx, but not an error object
    (422, '{"error": {"message": ""}}', False),
])
def test_a_hostile_answer_is_clean_only_as_a_4xx_error_object_with_a_message(status, text, ok):
    assert (clean_refusal(status, text) is None) is ok


def test_the_table_shows_each_process_growth_and_the_requests_by_kind():
    tally = SoakTally()
    tally.record("chat", None, 1.0)
    tally.record("hostile", None, 2.0, "temperature NaN")
    samples = [{"t": t, "rss_mb": {"router": 100.0 + t}} for t in range(0, 21, 5)]
    result = {"setup": {"warmup_s": 10, "duration_s": 20}, "samples": samples,
              "verdict": verdict(samples, ["router"], tally, warmup_s=10, window_s=0, max_growth=0.1, exited=[]),
              "tally": tally.as_dict()}
    text = table(result)
    assert "| router | 110 MB | 120 MB | +9.1% | 120 MB | +600.0 MB per 10 min |" in text
    assert "| hostile (a clean 4xx each) | 1 | 1 | 0 |" in text and text.endswith("Verdict: PASS.")


def test_the_trend_is_the_slope_after_the_warmup_mark_per_ten_minutes():
    samples = [{"t": t, "rss_mb": {"router": 500.0 if t < 300 else 100 + t / 60}} for t in range(0, 1801, 60)]
    assert trend_mb_per_10min(samples, "router", 300) == pytest.approx(10.0)  # 1 MB a minute; the warm-up's jump not
    assert trend_mb_per_10min(samples[:6], "router", 300) == 0.0  # one sample after the mark: no slope
