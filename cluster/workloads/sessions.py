"""Workloads: lists of sessions, each a sequence of turns, sized by a token budget.

=============  ==================================================================================
chatbot        ``num_prefixes`` shared system prompts (tenants) + a unique user message each
multi_turn     conversations whose history (previous prompts + answers) grows turn by turn
rag            shared instructions + a document from a pool (unique by default) + a question
random         unrelated random prompts of random length
mooncake       trace replay: one ``trace_block_tokens`` block per hash id (prefixes preserved)
azure          trace replay: arrival times and lengths (no shared prefixes)
tool_agent     replay of the simulator's generated tool-agent trace (``generated.ToolAgentTrace``):
               the same workload ``kvmesh sim --workload tool_agent`` simulates, sent to a real endpoint
=============  ==================================================================================

Sizes are in tokens. Single-turn sessions keep ``prompt <= max_prompt_tokens``; multi-turn
sessions stop early when the next turn would not fit (see :mod:`.session`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from kvmesh.cluster.loadgen.prompts import PromptMaker, join
from kvmesh.cluster.workloads.traces import AzureRecord, MooncakeRecord

WORKLOADS = ("chatbot", "multi_turn", "rag", "random", "mooncake", "azure", "tool_agent")


@dataclass(slots=True)
class Turn:
    """One request of a session."""

    user: list[int] | str
    """What this turn adds to the prompt (the user's message, or the whole prompt if single-turn)."""
    max_tokens: int
    """Tokens to generate."""
    system: str | list[int] | None = None
    """Shared prefix sent first (chat: the system message); part of the first turn only."""


@dataclass(slots=True)
class Session:
    session_id: str
    turns: list[Turn]
    arrival_s: float | None = None
    """Start time from a trace (seconds from the start, already time-scaled); None: the runner decides."""
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Budget:
    """Token sizes shared by every workload."""

    max_prompt_tokens: int = 384
    """Longest prompt sent (stories260K has a 512-token context)."""
    max_tokens: int = 32
    """Tokens generated per request."""

    def __post_init__(self) -> None:
        if self.max_prompt_tokens < 1 or self.max_tokens < 1:
            raise ValueError(f"max_prompt_tokens and max_tokens must be >= 1, got "
                             f"{self.max_prompt_tokens} and {self.max_tokens}")


def _split(total: int, share: float) -> tuple[int, int]:
    first = max(1, min(total - 1, round(total * share))) if total > 1 else total
    return first, max(0, total - first)


def chatbot(num_requests: int, budget: Budget, maker: PromptMaker, as_text: bool, *,
            num_prefixes: int = 1, system_share: float = 0.75, seed: int = 0) -> list[Session]:
    """Every request: one of ``num_prefixes`` system prompts (``system_share`` of the budget) + a unique question."""
    sys_tokens, user_tokens = _split(budget.max_prompt_tokens, system_share)
    systems = [maker.piece(sys_tokens, ("system", seed, p), as_text) for p in range(num_prefixes)]
    rng = random.Random(seed)
    return [Session(f"chat-{i}", [Turn(maker.piece(user_tokens, ("user", seed, i), as_text), budget.max_tokens,
                                       system=systems[rng.randrange(num_prefixes)])])
            for i in range(num_requests)]


def multi_turn(num_conversations: int, budget: Budget, maker: PromptMaker, as_text: bool, *,
               num_turns: int = 4, system_share: float = 0.25, seed: int = 0) -> list[Session]:
    """Conversations of up to ``num_turns`` turns: a system prompt, then user messages sized so
    that all turns plus answers fit the budget; each turn resends the whole history."""
    sys_tokens, rest = _split(budget.max_prompt_tokens, system_share)
    per_turn = max(1, (rest - (num_turns - 1) * budget.max_tokens) // num_turns)
    system = maker.piece(sys_tokens, ("system", seed), as_text)
    return [Session(f"conv-{c}", [Turn(maker.piece(per_turn, ("turn", seed, c, t), as_text), budget.max_tokens,
                                       system=system if t == 0 else None) for t in range(num_turns)],
                    extra={"multi_turn": True})
            for c in range(num_conversations)]


def rag(num_requests: int, budget: Budget, maker: PromptMaker, as_text: bool, *,
        num_documents: int | None = None, instruction_share: float = 0.2, question_share: float = 0.1,
        seed: int = 0) -> list[Session]:
    """Shared instructions + a document (``num_documents`` None: unique per request) + a question."""
    total = budget.max_prompt_tokens
    instr = max(1, round(total * instruction_share))
    question = max(1, round(total * question_share))
    doc = max(1, total - instr - question)
    instructions = maker.piece(instr, ("instructions", seed), as_text)
    rng = random.Random(seed)
    sessions = []
    for i in range(num_requests):
        d = i if num_documents is None else rng.randrange(num_documents)
        prompt = join([maker.piece(doc, ("doc", seed, d), as_text), maker.piece(question, ("q", seed, i), as_text)],
                      as_text)
        sessions.append(Session(f"rag-{i}", [Turn(prompt, budget.max_tokens, system=instructions)]))
    return sessions


def random_prompts(num_requests: int, budget: Budget, maker: PromptMaker, as_text: bool, *,
                   min_prompt_tokens: int = 1, seed: int = 0) -> list[Session]:
    """Unrelated prompts with lengths uniform in [min_prompt_tokens, max_prompt_tokens]."""
    rng = random.Random(seed)
    lo = max(1, min(min_prompt_tokens, budget.max_prompt_tokens))
    return [Session(f"rand-{i}", [Turn(maker.piece(rng.randint(lo, budget.max_prompt_tokens), ("rand", seed, i),
                                                   as_text), budget.max_tokens)])
            for i in range(num_requests)]


def mooncake(records: list[MooncakeRecord], budget: Budget, maker: PromptMaker, as_text: bool, *,
             trace_block_tokens: int = 16, time_scale: float = 1.0, seed: int = 0) -> list[Session]:
    """Mooncake replay: hash id ``h`` -> a fixed ``trace_block_tokens`` block; the prompt is its
    blocks cut to ``input_length * trace_block_tokens / 512`` and to the budget."""
    sessions = []
    t0 = records[0].arrival_s if records else 0.0
    for i, r in enumerate(records):
        n = max(1, min(budget.max_prompt_tokens, round(r.input_length * trace_block_tokens / 512)))
        blocks = [maker.piece(trace_block_tokens, ("block", seed, h), as_text)
                  for h in r.hash_ids[: -(-n // trace_block_tokens)]]
        prompt = join(blocks, as_text)
        if not as_text:
            prompt = prompt[:n]
        out = max(1, min(budget.max_tokens, r.output_length))
        sessions.append(Session(f"mc-{i}", [Turn(prompt, out)], arrival_s=(r.arrival_s - t0) * time_scale))
    return sessions


def azure(records: list[AzureRecord], budget: Budget, maker: PromptMaker, as_text: bool, *,
          length_scale: float = 1.0, time_scale: float = 1.0, seed: int = 0) -> list[Session]:
    """Azure replay: random prompts with the trace's (scaled, budget-capped) lengths and timing."""
    sessions = []
    for i, r in enumerate(records):
        n = max(1, min(budget.max_prompt_tokens, round(r.context_tokens * length_scale)))
        out = max(1, min(budget.max_tokens, round(r.generated_tokens * length_scale)))
        sessions.append(Session(f"az-{i}", [Turn(maker.piece(n, ("az", seed, i), as_text), out)],
                                arrival_s=r.arrival_s * time_scale))
    return sessions
