"""Prompt sessions for an HTTP endpoint, rendered from a registered workload's ``hash_ids`` records.

One renderer for every workload (``render``): hash id ``h`` becomes a fixed block of ``block_tokens``
token ids or words (``PromptMaker.piece`` keyed by ``h``: the same id, the same block), and a record's
prompt is its blocks cut to ``input_length * length_scale`` tokens and to ``max_prompt_tokens``.

- replay (mooncake, azure*, tool_agent): each record is a one-turn session at its timestamp x ``time_scale``.
- conversation (chatbot, multi_turn, rag, random): the records of one ``session_id`` are the turns of one
  session; the first turn's ``system_blocks`` are its system prompt, each later turn's message is the
  blocks it adds; the runner appends the real answers and starts sessions by its own loop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kvmesh.cluster.measure.workloads.adapters import AdapterRecord
from kvmesh.cluster.measure.workloads.generated import SessionRecord
from kvmesh.cluster.measure.workloads.prompts import PromptMaker, join
from kvmesh.cluster.measure.workloads.traces import MOONCAKE_BLOCK_TOKENS, MooncakeRecord


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
    """Requests sent one after the other, each turn's prompt extending the last (history + answers)."""

    session_id: str
    """Names the session in the results."""
    turns: list[Turn]
    """Its requests, in order."""
    arrival_s: float | None = None
    """Start time from a trace (seconds from the start, already time-scaled); None: the runner decides."""
    extra: dict = field(default_factory=dict)
    """Free-form tags (``multi_turn``)."""
    model: str | None = None
    """The "model" its requests name: a LoRA adapter of the ``lora`` workload; None: the run's (--model)."""


@dataclass(frozen=True, slots=True)
class Rendering:
    """How records become prompts: sizes in tokens of the endpoint's model."""

    maker: PromptMaker
    """Makes a block's token ids or words."""
    as_text: bool
    """Words instead of token ids."""
    max_prompt_tokens: int = 384
    """Longest prompt sent (stories260K has a 512-token context)."""
    max_tokens: int = 32
    """Most tokens generated per request."""
    block_tokens: int = 16
    """Tokens per hash id."""
    length_scale: float = 16 / MOONCAKE_BLOCK_TOKENS
    """Prompt tokens per trace token (``block_tokens / 512`` keeps whole trace blocks whole)."""
    output_scale: float = 1.0
    """Multiplies the records' output lengths (before ``max_tokens`` caps them)."""
    time_scale: float = 1.0
    """Multiplies replayed timestamps (0.5 = twice the rate)."""
    seed: int = 0
    """Seed of the blocks' contents."""

    def __post_init__(self) -> None:
        if min(self.max_prompt_tokens, self.max_tokens, self.block_tokens) < 1:
            raise ValueError(f"max_prompt_tokens, max_tokens and block_tokens must be >= 1, got "
                             f"{self.max_prompt_tokens}, {self.max_tokens} and {self.block_tokens}")

    def blocks(self, record: MooncakeRecord) -> list[list[int] | str]:
        """The record's prompt as one piece per hash id, cut to its length and to the budget."""
        n = max(1, min(self.max_prompt_tokens, round(record.input_length * self.length_scale)))
        b = self.block_tokens
        return [self.maker.piece(min(b, n - k * b), ("block", self.seed, h), self.as_text)
                for k, h in enumerate(record.hash_ids[: math.ceil(n / b)])]

    def output(self, record: MooncakeRecord) -> int:
        return max(1, min(self.max_tokens, round(record.output_length * self.output_scale)))


def render(records: list[MooncakeRecord], r: Rendering, conversation: bool,
           max_sessions: int | None = None) -> list[Session]:
    """Sessions of ``records``: a replay (one per record) or conversations (one per session id)."""
    if not conversation:
        t0 = records[0].arrival_s if records else 0.0
        return [Session(f"req-{i}", [Turn(join(r.blocks(rec), r.as_text), r.output(rec))],
                        arrival_s=(rec.arrival_s - t0) * r.time_scale, model=_adapter(rec))
                for i, rec in enumerate(records[:max_sessions])]
    by_session: dict[str, list[MooncakeRecord]] = {}
    for i, rec in enumerate(records):
        sid = rec.session_id if isinstance(rec, SessionRecord) and rec.session_id else f"req-{i}"
        by_session.setdefault(sid, []).append(rec)
    return [_conversation(sid, recs, r) for sid, recs in list(by_session.items())[:max_sessions]]


def _conversation(session_id: str, records: list[MooncakeRecord], r: Rendering) -> Session:
    first = records[0]
    done = first.system_blocks if isinstance(first, SessionRecord) else 0
    turns = []
    for rec in records:
        pieces = r.blocks(rec)
        system = join(pieces[:done], r.as_text) if not turns and done else None
        turns.append(Turn(join(pieces[done:], r.as_text), r.output(rec), system=system))
        done = len(rec.hash_ids)
    return Session(session_id, turns, extra={"multi_turn": True} if len(turns) > 1 else {}, model=_adapter(first))


def _adapter(record: MooncakeRecord) -> str | None:
    """The adapter a ``lora`` workload's record names (requests of a base model go to the run's model)."""
    return record.lora_name if isinstance(record, AdapterRecord) else None
