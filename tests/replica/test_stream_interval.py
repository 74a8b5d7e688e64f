"""``stream_interval``: a request's outputs merged a few tokens at a time, the first and the last at once."""

from __future__ import annotations

import asyncio

from kvmesh.replica.server.parallel_sampling import in_batches
from kvmesh.replica.step.outputs import RequestOutput, TokenLogprobs


def outputs(n: int):
    ids: list[int] = []
    for i in range(n):
        ids.append(10 + i)
        yield RequestOutput("r", [1, 2], [10 + i], ids, f"t{i} ", "", i == n - 1, "length" if i == n - 1 else None,
                            new_logprobs=[TokenLogprobs([10 + i], [-float(i)], 1)])


async def collect(n: int, interval: int) -> tuple[list, bool]:
    closed = False

    async def stream():
        nonlocal closed
        try:
            for out in outputs(n):
                yield out
        finally:
            closed = True

    got = [out async for out in in_batches(stream(), interval)]
    return got, closed


def test_outputs_come_interval_tokens_at_a_time_with_their_text_and_logprobs_in_order():
    got, closed = asyncio.run(collect(8, 3))
    assert [o.new_token_ids for o in got] == [[10], [11, 12, 13], [14, 15, 16], [17]]
    assert [o.delta_text for o in got] == ["t0 ", "t1 t2 t3 ", "t4 t5 t6 ", "t7 "]
    assert [[lp.token_ids[0] for lp in o.new_logprobs] for o in got] == [o.new_token_ids for o in got]
    assert got[-1].finished and got[-1].finish_reason == "length" and closed


def test_an_interval_of_one_passes_every_output():
    got, _ = asyncio.run(collect(4, 1))
    assert [o.new_token_ids for o in got] == [[10], [11], [12], [13]]
