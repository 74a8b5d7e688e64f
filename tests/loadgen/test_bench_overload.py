"""kvmesh bench overload: the verdict and percentile logic on hand-made request
records, and one short run of the driver against a tiny in-test server that sheds the flooding tenant with 429 +
Retry-After (the result file's shape, the request bodies: tenants by ``user``, priorities in the body)."""

from __future__ import annotations

import asyncio
import json
import math
import threading

import pytest
from aiohttp import web
from kvmesh.cluster.measure.benchmarks.overload import main
from kvmesh.cluster.measure.benchmarks.support.overload_report import (
    COLUMNS,
    load_result,
    percentile,
    summarize,
    verdict,
)


def rec(phase, cls, ttft=0.01, outcome="ok", answer=0.005, retry_after=None, t=0.0):
    return {"phase": phase, "cls": cls, "t": t, "outcome": outcome, "status": None, "ttft_s": ttft,
            "answer_s": answer, "e2e_s": 0.1 if outcome == "ok" else None, "retry_after": retry_after, "tokens": 4}


def passing_run():
    return ([rec("alone", "light", ttft=x) for x in (0.2, 0.31, 0.4)]  # p50 alone 0.31 s: the limit is 0.93 s
            + [rec("flood", "light", ttft=0.1 * i) for i in range(1, 10)]  # p90 0.9 s
            + [rec("flood", "flood")] * 5 + [rec("flood", "flood", None, "429", 1.9, "2")] * 5
            + [rec("overload_2x", "high", 0.4)] * 9 + [rec("overload_2x", "bulk", None, "429", 0.01, "1")] * 3
            + [rec("overload_4x", "high", 0.5)] * 10 + [rec("overload_4x", "bulk", None, "not_sent", None)])


def failed(v):
    return {c["name"] for c in v["criteria"] if not c["pass"]}


def test_percentiles_are_nearest_rank_and_a_request_without_a_first_token_is_infinitely_late():
    assert percentile([], 0.9) is None
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([float(i) for i in range(1, 11)], 0.9) == 9.0
    assert percentile([float(i) for i in range(1, 11)], 0.99) == 10.0
    s = summarize([rec("p", "c", 0.1)] * 8 + [rec("p", "c", None, "timeout")] * 2
                  + [rec("p", "c", None, "not_sent")])  # never sent: not a request of the class
    assert s["sent"] == 10 and s["with_first_token"] == 8
    assert s["ttft_p50_s"] == 0.1 and s["ttft_p90_s"] is None and s["ttft_max_s"] is None  # inf is written as null
    assert s["outcomes"] == {"not_sent": 1, "ok": 8, "timeout": 2}


def test_the_verdict_passes_a_run_that_meets_every_criterion():
    v = verdict(passing_run(), [2, 4], 0.5)
    assert v["pass"], v
    assert [c["name"] for c in v["criteria"]] == ["light_ttft_p90_under_flood", "flood_ends_200_or_fast_429",
                                                  "flood_no_5xx_or_timeout", "high_priority_2x", "high_priority_4x"]
    assert v["criteria"][0]["limit"] == pytest.approx(0.93)


@pytest.mark.parametrize(("change", "fails"), [
    (rec("flood", "light", ttft=5.0), {"light_ttft_p90_under_flood"}),  # p90 now 5 s -> above 3 x 0.31 s
    (rec("flood", "flood", None, "429", 2.5, "1"), {"flood_ends_200_or_fast_429"}),  # too slow a 429
    (rec("flood", "flood", None, "429", 0.1, None), {"flood_ends_200_or_fast_429"}),  # no Retry-After
    (rec("flood", "flood", None, "5xx"), {"flood_ends_200_or_fast_429", "flood_no_5xx_or_timeout"}),
    (rec("flood", "flood", None, "timeout"), {"flood_ends_200_or_fast_429", "flood_no_5xx_or_timeout"}),
    (rec("flood", "flood", 0.2, "stream_error"), {"flood_ends_200_or_fast_429", "flood_no_5xx_or_timeout"}),
    (rec("overload_4x", "high", None, "cancelled"), {"high_priority_4x"}),  # 2 of 12 never served: p90 inf
    (rec("overload_2x", "high", None, "429", 0.01, "1"), {"high_priority_2x"}),  # a shed high request misses
])
def test_each_criterion_fails_on_its_own_kind_of_bad_request(change, fails):
    assert failed(verdict(passing_run() + [change] * 2, [2, 4], 0.5)) == fails


def test_the_light_limit_has_a_floor_and_no_run_is_no_pass():
    fast = [rec("alone", "light", ttft=0.001)] * 3 + [rec("flood", "light", ttft=0.45)] * 3
    light = verdict(fast, [], 0.5)["criteria"][0]
    assert light["pass"] and light["limit"] == 0.5  # max(3 x 1 ms, 0.5 s)
    assert failed(verdict([], [2], 0.5)) == {"light_ttft_p90_under_flood", "flood_ends_200_or_fast_429",
                                             "flood_no_5xx_or_timeout", "high_priority_2x"}


class SheddingServer:
    """Streams ``max_tokens`` one-word chunks; answers every other request of the user ``flood`` with 429 and
    Retry-After. Keeps every body it got."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.url = ""
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        if body.get("user") == "flood" and len(self.bodies) % 2 == 0:
            return web.json_response({"error": {"message": "over limit", "type": "rate_limit"}}, status=429,
                                     headers={"Retry-After": "1"})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(body["max_tokens"]):
            await resp.write(b'data: {"choices": [{"index": 0, "text": " a"}]}\n\n')
        await resp.write(b"data: [DONE]\n\n")
        return resp

    def __enter__(self) -> SheddingServer:
        def run() -> None:
            asyncio.set_event_loop(self._loop)
            app = web.Application()
            app.router.add_post("/v1/completions", self.completions)
            self._runner = web.AppRunner(app)
            self._loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            self._loop.run_until_complete(site.start())
            self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
            self._ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def test_a_short_run_sends_tenants_and_priorities_and_writes_every_number(tmp_path):
    out = tmp_path / "overload.json"
    with SheddingServer() as server:
        code = main(["--url", server.url, "--alone-s", "0.6", "--light-period-s", "0.2", "--flood-s", "1",
                     "--flood-clients", "4", "--flood-tokens", "4", "--retry-after-cap-s", "0.05", "--levels", "2",
                     "--capacity", "10", "--overload-s", "1", "--high-share", "0.25", "--drain-s", "1",
                     "--settle-s", "0", "--progress-s", "0", "--out", str(out)])
    result = load_result(out.read_text())
    assert json.loads(out.read_text())["requests"]["columns"] == list(COLUMNS)  # one compact row per request
    assert code == 0 and result["verdict"]["pass"], result["verdict"]
    assert out.with_suffix(".png").stat().st_size > 10_000
    assert result["capacity_rps"] == 10 and result["capacity_source"] == "--capacity"
    assert list(result["phases"]) == ["alone", "flood", "overload_2x"]
    flood = result["phases"]["flood"]["flood"]
    assert flood["outcomes"]["429"] == flood["shed_429_fast_with_retry_after"] > 0 and flood["outcomes"]["ok"] > 0
    assert result["phases"]["overload_2x"]["high"]["sent"] == 5  # arrivals 0, 4, 8, 12, 16 of 20 in 1 s at 20/s
    assert {r["cls"] for r in result["requests"]} == {"light", "flood", "high", "bulk"}
    assert all(not math.isnan(r["t"]) and r["outcome"] in ("ok", "429") for r in result["requests"])
    users = {(b["user"], b.get("priority")) for b in server.bodies}
    assert users == {("light", None), ("flood", None), ("vip", -1), ("flood", 1)}
    assert all(b["stream"] and b["ignore_eos"] for b in server.bodies)


def test_tenant_keys_come_from_pairs_or_a_router_keys_file(tmp_path):
    from kvmesh.cluster.measure.benchmarks.support.overload_keys import load_tenant_keys

    keys = tmp_path / "keys.yaml"
    keys.write_text("keys:\n  - {key: sk-light-0001, tenant: light, priority: 0}\n"
                    "  - {key: sk-light-0002, tenant: light}\n  - {key: sk-flood-0001, tenant: flood}\n")
    assert load_tenant_keys(["vip=sk-vip-0001"], str(keys)) == {"light": "sk-light-0001", "flood": "sk-flood-0001",
                                                                 "vip": "sk-vip-0001"}
    keys.write_text("keys:\n  - {key: 12345678}\n")
    with pytest.raises(ValueError, match="entry 0 needs a string key and tenant"):
        load_tenant_keys([], str(keys))
    with pytest.raises(ValueError, match="expected USER=KEY"):
        load_tenant_keys(["light"], None)
