"""What a registered workload is asked for (``WorkloadSettings``): both commands fill it from their flags.

``WorkloadShape`` is the part without units (tenants, turns, documents, the shared share of a prompt):
both commands take it whole as their ``shape`` section, so ``--num-prefixes``, ``--turns``,
``--num-documents`` and ``--system-share`` are defined once. Sizes stay each command's own (the
simulator counts trace tokens, the load generator a model's token budget) and are converted here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvmesh.cluster.measure.workloads.adapters import AdapterShape


@dataclass(frozen=True, slots=True)
class WorkloadShape:
    """How a generated workload shares its prompts: tenants, turns, documents."""

    num_prefixes: int = 8
    """chatbot, multi_turn: tenants, each with its own system prompt."""
    system_share: float | None = None
    """Share of the prompt that is shared (default: chatbot 0.75, multi_turn 0.25, rag 0.2)."""
    turns: int = 6
    """multi_turn: turns per conversation."""
    num_documents: int | None = None
    """rag: document pool size (default: a unique document per request)."""
    adapters: AdapterShape = field(default_factory=AdapterShape, metadata={"prefix": ""})
    """lora: LoRA adapters (Zipf popularity, prefixes of their own) and base models."""

    def __post_init__(self) -> None:
        if self.num_prefixes < 1 or self.turns < 1:
            raise ValueError(f"num_prefixes and turns must be >= 1, got {self.num_prefixes} and {self.turns}")
        if self.system_share is not None and not 0 < self.system_share < 1:
            raise ValueError(f"system_share must be in (0, 1), got {self.system_share}")
        if self.num_documents is not None and self.num_documents < 1:
            raise ValueError(f"num_documents must be >= 1, got {self.num_documents}")


MINIATURE = 32
"""Trace tokens per live token where a trace is sent to an emulated fleet (the simulator's miniature of its default
fleet): one 512-token trace block is one 16-token block, so a live prompt costs what 32 times it costs the GPU."""

LOAD_SHAPE = WorkloadShape(num_prefixes=4, turns=4)
"""``kvmesh bench load``'s default shape (fewer tenants and turns than the simulator's, for a live fleet's minutes); the
simulator's half of the emulated-fleet checks sends what bench load sends, so both read it here."""


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
    shape: WorkloadShape = field(default_factory=WorkloadShape)
    """Tenants, turns, documents (the commands' ``shape`` section)."""
    output_tokens: int | None = None
    """Tokens generated per request of a generated workload (None: the generator's own)."""
    seed: int = 0
    """Seed of every random choice."""

    def __post_init__(self) -> None:
        if min(self.num_requests, self.prompt_tokens) < 1:
            raise ValueError(f"num_requests and prompt_tokens must be >= 1, got {self.num_requests} and "
                             f"{self.prompt_tokens}")
        if self.rate is not None and not self.rate > 0:
            raise ValueError(f"rate must be > 0 sessions/s, got {self.rate}")
