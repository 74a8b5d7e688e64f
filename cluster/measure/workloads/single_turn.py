"""Generated one-request sessions in the ``hash_ids`` format: chatbot questions, RAG lookups, random prompts.

Each record is a session of its own (``session_id``), started as a Poisson process at ``rate`` per
second. Sizes are in trace tokens (``MOONCAKE_BLOCK_TOKENS`` = 512 per hash id); a prompt of
``prompt_tokens`` spans ``ceil(prompt_tokens / 512)`` hash ids, the last one cut.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator

from kvmesh.cluster.measure.workloads.generated import SessionRecord
from kvmesh.cluster.measure.workloads.traces import MOONCAKE_BLOCK_TOKENS


def _arrivals_ms(rate: float, rng: random.Random) -> Iterator[float]:
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        yield 1000.0 * t


def _blocks(tokens: float) -> int:
    return max(1, math.ceil(tokens / MOONCAKE_BLOCK_TOKENS))


def chatbot(num_requests: int, prompt_tokens: int, *, num_tenants: int = 8, system_share: float = 0.75,
            rate: float = 1.0, output_tokens: int = 200, seed: int = 0) -> list[SessionRecord]:
    """Each request: one of ``num_tenants`` system prompts (``system_share`` of the prompt) + a unique question."""
    blocks = _blocks(prompt_tokens)
    system = min(blocks - 1, max(1, round(prompt_tokens * system_share / MOONCAKE_BLOCK_TOKENS)))
    rng, ids = random.Random(seed), itertools.count()
    systems = [[next(ids) for _ in range(system)] for _ in range(num_tenants)]
    arrivals = _arrivals_ms(rate, rng)
    return [SessionRecord(next(arrivals), prompt_tokens, output_tokens,
                          (*systems[rng.randrange(num_tenants)], *(next(ids) for _ in range(blocks - system))),
                          f"chat-{i}", system)
            for i in range(num_requests)]


def rag(num_requests: int, prompt_tokens: int, *, num_documents: int | None = None, instruction_share: float = 0.2,
        question_share: float = 0.1, rate: float = 1.0, output_tokens: int = 200, seed: int = 0) -> list[SessionRecord]:
    """Shared instructions + a document (``num_documents`` None: unique per request) + a unique question."""
    blocks = _blocks(prompt_tokens)
    instructions = max(1, round(blocks * instruction_share))
    question = max(1, round(blocks * question_share))
    document = max(1, blocks - instructions - question)
    rng, ids = random.Random(seed), itertools.count()
    shared = [next(ids) for _ in range(instructions)]
    documents: dict[int, list[int]] = {}
    arrivals = _arrivals_ms(rate, rng)
    out = []
    for i in range(num_requests):
        d = i if num_documents is None else rng.randrange(num_documents)
        doc = documents.setdefault(d, [next(ids) for _ in range(document)])
        hash_ids = (*shared, *doc, *(next(ids) for _ in range(question)))
        length = min(prompt_tokens, len(hash_ids) * MOONCAKE_BLOCK_TOKENS)
        out.append(SessionRecord(next(arrivals), length, output_tokens, hash_ids, f"rag-{i}", instructions))
    return out


def random_prompts(num_requests: int, prompt_tokens: int, *, rate: float = 1.0, output_tokens: int = 200,
                   seed: int = 0) -> list[SessionRecord]:
    """Unrelated prompts with lengths uniform in [1, prompt_tokens] (no shared blocks)."""
    rng, ids = random.Random(seed), itertools.count()
    arrivals = _arrivals_ms(rate, rng)
    out = []
    for i in range(num_requests):
        length = rng.randint(1, prompt_tokens)
        out.append(SessionRecord(next(arrivals), length, output_tokens,
                                 tuple(next(ids) for _ in range(_blocks(length))), f"rand-{i}"))
    return out
