"""kvmesh bench lora-fleet: how it tells a follow-up the router diverted from one it lost (the live run is
tests/cluster/test_lora_fleet_live.py and BENCHMARKS.md, "LoRA adapters through kvmesh serve")."""

from __future__ import annotations

from kvmesh.cluster.measure.benchmarks.lora_fleet import diverted, route_receipt, summarize

EXPECTED = 96


def receipt(replica: str, predicted: int, best: int, reason: str = "cache") -> dict:
    return route_receipt({"x-kvmesh-replica": replica, "x-kvmesh-route-reason": reason,
                          "x-kvmesh-predicted-hit-tokens": str(predicted), "x-kvmesh-best-hit-tokens": str(best)})


def conversation(cached_tokens: int, route: dict) -> dict:
    first = {"status": 200, "ttft_s": 0.01, "route": receipt("replica-0", 0, 0, "load")}
    follow_up = {"status": 200, "ttft_s": 0.01, "cached_tokens": cached_tokens, "route": route}
    cached = cached_tokens >= EXPECTED
    return {"adapter": "lora-0", "first": first, "follow_up": follow_up, "expected_cached": EXPECTED,
            "cached": cached, "diverted": not cached and diverted(follow_up, EXPECTED)}


def test_the_receipt_headers_are_read_and_an_answer_without_them_has_none():
    assert receipt("replica-1", 96, 112, "load") == {"replica": "replica-1", "reason": "load",
                                                       "predicted_hit_tokens": 96, "best_hit_tokens": 112}
    assert route_receipt({"content-type": "text/event-stream"}) == {}


def test_a_follow_up_sent_away_from_its_prefix_is_diverted_and_one_sent_to_it_but_not_cached_is_lost():
    convs = [
        conversation(96, receipt("replica-0", 96, 96)),  # cached where the router expected it
        conversation(0, receipt("replica-1", 0, 96, "load")),  # the cost chose the replica without the prefix
        conversation(0, receipt("replica-0", 96, 96)),  # expected there and not found: lost
        conversation(0, receipt("replica-1", 0, 0, "load")),  # the prefix known nowhere: lost
        conversation(0, {}),  # no receipt: lost
    ]
    assert [c["diverted"] for c in convs] == [False, True, False, False, False]
    s = summarize(convs, [], 1.0, 0.0)
    assert (s["follow_ups_cached"], s["follow_ups_diverted"], s["follow_ups_lost"]) == (1, 1, 3)
    assert not s["meets"]["no_follow_up_lost"]
    assert summarize(convs[:2], [], 1.0, 0.0)["meets"]["no_follow_up_lost"]
