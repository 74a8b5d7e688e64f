"""What the multi-router benchmark's clients send (multi_router.py): a shared trace's first records as token-id
prompts, and token-id conversations whose turns go to different routers (did each find its replica?)."""

from __future__ import annotations

import aiohttp
from kvmesh.cluster.measure.benchmarks.support.spread_client import REQUEST_TIMEOUT_S, Outcome, Request, send
from kvmesh.router.routing.receipts import HEADER_BEST, HEADER_OPT_IN

SESSION_FIRST_TOKENS = 64
"""A conversation's first prompt (4 blocks of 16 tokens); its next turn adds half as many."""
BLOCK_SIZE = 16
TRACES = ("azure_code", "azure_conv", "mooncake")
"""Workloads read from the shared traces (cluster/measure/workloads/registry.py)."""


def trace_requests(workload: str, num: int, num_routers: int) -> list[tuple[list[int], int]]:
    """A shared trace's first ``num`` records as token-id prompts (stories260K's vocabulary, 16 tokens per trace
    block), with the router each goes to in a spread run."""
    from kvmesh.cluster.measure.loadgen.load import build_sessions
    from kvmesh.cluster.measure.loadgen.options import BenchLoadConfig, WorkloadOptions
    from kvmesh.cluster.measure.workloads.prompts import PromptMaker

    config = BenchLoadConfig(workload=WorkloadOptions(workload=workload, num_requests=num))
    sessions = build_sessions(config, PromptMaker())
    return [(list(s.turns[0].user), i % num_routers) for i, s in enumerate(sessions)]


def conversations(count: int = 12) -> list[list[list[int]]]:
    """``count`` conversations of three turns as token-id prompts, each turn extending the last."""
    import random

    rng = random.Random(0)
    out = []
    for _ in range(count):
        turns = [[rng.randrange(3, 512) for _ in range(SESSION_FIRST_TOKENS)]]
        for _ in range(2):
            turns.append(turns[-1] + [rng.randrange(3, 512) for _ in range(SESSION_FIRST_TOKENS // 2)])
        out.append(turns)
    return out


async def send_turn(urls, model: str, talks: list[list[list[int]]], turn: int, router_of,
                    headers: dict[str, str]) -> list[Outcome]:
    """Turn ``turn`` of every conversation, conversation i through router ``router_of(i)``, each with ``headers``
    (the API key) and asking for the route receipt."""
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout, headers=headers | {HEADER_OPT_IN: "1"}) as http:
        return [await send(http, urls, Request(talk[turn], 1, router_of(i)), "sessions", model)
                for i, talk in enumerate(talks)]


def found_its_replica(talks: list[list[list[int]]], turn: int, answers: list[Outcome]) -> list[bool]:
    """For each conversation: did turn ``turn`` reach the replica that holds the turn before (its full blocks
    reported cached)?"""
    return [answer.cached_tokens >= len(talk[turn - 1]) - BLOCK_SIZE
            for talk, answer in zip(talks, answers, strict=True)]


def index_knew(talks: list[list[list[int]]], turn: int, answers: list[Outcome]) -> list[bool]:
    """For each conversation: did the router of turn ``turn`` know a replica holding the turn before (its route
    receipt's best hit: the prefix index it builds from the replicas' events), wherever its policy then sent it?"""
    return [int((answer.receipt or {}).get(HEADER_BEST, 0)) >= len(talk[turn - 1]) - BLOCK_SIZE
            for talk, answer in zip(talks, answers, strict=True)]


def turn_summary(talks: list[list[list[int]]], turn: int, answers: list[Outcome], before: list[Outcome]) -> dict:
    """How many of turn ``turn``'s routers knew the replica holding the turn before (``index_knew``), how many answers
    were computed there (``found``), and each answer that was not, with both turns' route receipts (the replica, why
    it was chosen, the hit it predicted and the best any replica offered): what a miss is read by."""
    found, knew = found_its_replica(talks, turn, answers), index_knew(talks, turn, answers)
    missed = [{"conversation": i, "status": answers[i].status, "cached_tokens": answers[i].cached_tokens,
               "error": answers[i].error, "receipt": answers[i].receipt, "turn_before_receipt": before[i].receipt}
              for i, hit in enumerate(found) if not hit]
    return {"found": sum(found), "index_knew": sum(knew), "missed": missed}
