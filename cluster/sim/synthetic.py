"""Generated traces in the Mooncake ``hash_ids`` format, for ``kvmesh sim --synthetic``.

Multi-turn conversations of several tenants: a conversation starts with its tenant's system
prompt (``system_blocks`` shared blocks), and each turn appends ``turn_blocks`` new blocks to the
whole history, so turn *k* shares turn *k-1*'s prompt as a prefix. Conversations start as a
Poisson process; turns follow each other after an exponential think time. Each record carries
its conversation's ``session_id``.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

from kvmesh.cluster.benchmarks.traces import MOONCAKE_BLOCK_TOKENS, MooncakeRecord


@dataclass(frozen=True, slots=True)
class SyntheticTrace:
    """Shape of a generated trace."""

    num_requests: int = 2000
    """Requests in total (the last conversation may be cut short)."""
    conversations_per_s: float = 1.0
    """Poisson rate at which conversations start."""
    num_tenants: int = 8
    """Distinct system prompts."""
    system_blocks: int = 8
    """Blocks (512 tokens each) of a tenant's system prompt."""
    turn_blocks: int = 4
    """Blocks each turn adds (user message + previous answer)."""
    turns: int = 6
    """Turns per conversation."""
    think_s: float = 20.0
    """Mean pause between the turns of a conversation."""
    output_tokens: int = 200
    """Tokens generated per request."""
    seed: int = 0

    def __post_init__(self) -> None:
        if min(self.num_requests, self.num_tenants, self.turns, self.system_blocks + self.turn_blocks) < 1:
            raise ValueError("num_requests, num_tenants, turns and system_blocks + turn_blocks must be >= 1")
        if not self.conversations_per_s > 0 or self.think_s < 0:
            raise ValueError("conversations_per_s must be > 0 and think_s >= 0")

    def records(self) -> list[MooncakeRecord]:
        from kvmesh.cluster.sim.workloads import SessionRecord

        rng = random.Random(self.seed)
        next_id = itertools.count()
        systems = [[next(next_id) for _ in range(self.system_blocks)] for _ in range(self.num_tenants)]
        out: list[MooncakeRecord] = []
        start, conv = 0.0, 0
        while len(out) < self.num_requests:
            start += rng.expovariate(self.conversations_per_s)
            ids = list(systems[rng.randrange(self.num_tenants)])
            t, sid = start, f"conv-{conv}"
            conv += 1
            for _ in range(self.turns):
                ids = ids + [next(next_id) for _ in range(self.turn_blocks)]
                out.append(SessionRecord(1000.0 * t, len(ids) * MOONCAKE_BLOCK_TOKENS, self.output_tokens,
                                         tuple(ids), sid))
                t += rng.expovariate(1.0 / self.think_s) if self.think_s else 0.0
                if len(out) >= self.num_requests:
                    break
        out.sort(key=lambda r: r.timestamp_ms)
        return out
