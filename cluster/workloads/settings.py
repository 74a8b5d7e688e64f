"""What a registered workload is asked for (``WorkloadSettings``): both commands fill it from their flags."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class WorkloadSettings:
    """The knobs of the registered workloads; sizes are trace tokens (512 per hash id)."""

    num_requests: int = 2000
    """Requests a generated workload makes (the last conversation or agent may be cut short)."""
    trace: str | None = None
    """Trace file of mooncake and the azure workloads (None: the workload's shared trace)."""
    trace_limit: int | None = None
    """Read only the first N records of a trace (None: all)."""
    rate: float | None = None
    """Sessions (conversations, agents, questions) started per second, Poisson (None: the generator's own)."""
    prompt_tokens: int = 16384
    """Generated prompt size: chatbot's and rag's prompt, random's longest, multi_turn's last turn."""
    answer_tokens: int = 0
    """multi_turn: tokens each later turn leaves for the previous answer (0: a turn's blocks stand for it)."""
    system_share: float | None = None
    """Share of the prompt that is shared (None: chatbot 0.75, multi_turn 0.25, rag 0.2)."""
    num_prefixes: int = 8
    """Tenants, each with its own system prompt (chatbot, multi_turn)."""
    turns: int = 6
    """multi_turn: turns per conversation."""
    num_documents: int | None = None
    """rag: document pool size (None: a unique document per request)."""
    output_tokens: int | None = None
    """Tokens generated per request of a generated workload (None: the generator's own)."""
    seed: int = 0
    """Seed of every random choice."""

    def __post_init__(self) -> None:
        if min(self.num_requests, self.prompt_tokens, self.num_prefixes, self.turns) < 1:
            raise ValueError("num_requests, prompt_tokens, num_prefixes and turns must be >= 1")
        if self.system_share is not None and not 0 < self.system_share < 1:
            raise ValueError(f"system_share must be in (0, 1), got {self.system_share}")
        if self.rate is not None and not self.rate > 0:
            raise ValueError(f"rate must be > 0 sessions/s, got {self.rate}")
