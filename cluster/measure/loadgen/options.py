"""``kvmesh bench load``'s settings: the endpoint, the workload and how it is sent, one dataclass each;
its flags (``--url``, ``--workload``, ``--mode`` ...) are derived from them (``cluster/config/flags.py``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from kvmesh.cluster.config.schema import Schema
from kvmesh.cluster.measure.workloads.prompts import PromptMaker
from kvmesh.cluster.measure.workloads.registry import Workload, get_workload
from kvmesh.cluster.measure.workloads.sessions import Rendering
from kvmesh.cluster.measure.workloads.settings import LOAD_SHAPE, WorkloadSettings, WorkloadShape
from kvmesh.cluster.measure.workloads.traces import MOONCAKE_BLOCK_TOKENS


def _choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")


@dataclass(frozen=True, slots=True)
class EndpointOptions:
    """The OpenAI-compatible endpoint under test (a router, a replica, any server)."""

    url: str = "http://127.0.0.1:8000"
    """OpenAI endpoint base URL."""
    model: str | None = None
    """Model name (default: the first of GET /v1/models)."""
    api_key: str | None = field(default=None, repr=False, metadata={"cli": True})
    """Bearer token for servers started with --api-key."""
    api: str = "completions"
    """``completions`` or ``chat``."""
    prompt_format: str = "tokens"
    """``tokens``: token-id lists (exact lengths, completions only); ``text``: words."""
    receipts: bool = False
    """Ask a kvmesh router for each request's route receipt (``x-kvmesh-receipt``) and keep its headers with the
    request's figures: the replica, why it was chosen, the hit it predicted there and the best anywhere."""

    def __post_init__(self) -> None:
        _choice("api", self.api, ("completions", "chat"))
        _choice("prompt_format", self.prompt_format, ("tokens", "text"))


@dataclass(frozen=True, slots=True)
class WorkloadOptions:
    """What is sent: a registered workload (``cluster/measure/workloads/registry.py``) rendered into prompts."""

    workload: str = "chatbot"
    """A registered workload (listed below; cluster/measure/workloads/registry.py)."""
    num_requests: int = 64
    """Requests; conversation workloads: sessions (multi_turn: conversations); traces: the first N records."""
    max_prompt_tokens: int = 384
    """Token budget of a prompt; keep prompt + --max-tokens within the model's context."""
    max_tokens: int = 32
    """Tokens generated per request."""
    trace: str | None = None
    """Trace file of mooncake (JSONL) and the azure workloads (CSV); default: the shared one."""
    trace_block_tokens: int = 16
    """Tokens sent per hash id, i.e. per 512-token trace block (every workload but azure)."""
    length_scale: float = 1.0
    """azure: multiply the trace's lengths."""
    time_scale: float = 1.0
    """Traces: multiply timestamps (0.5 = 2x the rate)."""
    vocab_size: int = 512
    """Token ids are drawn below this."""
    tokens_per_word: float | None = None
    """Text prompts: tokens per word (default: measured with POST /tokenize, else 2.0)."""
    seed: int = 0
    """Seed of the generated prompts and of Poisson arrivals."""

    def __post_init__(self) -> None:
        get_workload(self.workload)
        if self.trace_block_tokens < 1:
            raise ValueError(f"trace_block_tokens must be >= 1, got {self.trace_block_tokens}")

    def settings(self, entry: Workload, shape: WorkloadShape) -> WorkloadSettings:
        """The registry's settings: the token budget in trace tokens (``trace_block_tokens`` per 512), and
        a conversation workload asked for whole sessions (``turns`` requests each)."""
        per_token = MOONCAKE_BLOCK_TOKENS / self.trace_block_tokens
        return WorkloadSettings(
            num_requests=self.num_requests * (shape.turns if entry.conversation else 1), trace=self.trace,
            trace_limit=self.num_requests, prompt_tokens=round(self.max_prompt_tokens * per_token),
            answer_tokens=round(self.max_tokens * per_token), shape=shape, seed=self.seed)

    def rendering(self, entry: Workload, maker: PromptMaker, as_text: bool) -> Rendering:
        """How the records become prompts: ``trace_block_tokens`` per hash id, or azure's real lengths."""
        real = entry.real_lengths
        block = max(1, round(MOONCAKE_BLOCK_TOKENS * self.length_scale)) if real else self.trace_block_tokens
        scale = self.length_scale if real else block / MOONCAKE_BLOCK_TOKENS
        return Rendering(maker, as_text, self.max_prompt_tokens, self.max_tokens, block, scale,
                         output_scale=self.length_scale if real else 1.0, time_scale=self.time_scale, seed=self.seed)


@dataclass(frozen=True, slots=True)
class LoadOptions:
    """How the sessions are sent (``loadgen/runner.py``)."""

    mode: str = "closed"
    """``open`` (arrivals) or ``closed`` (fixed concurrency)."""
    rate: float | None = None
    """Open loop: sessions/s, Poisson (default for traces: their timestamps)."""
    concurrency: int | None = None
    """Closed loop: sessions in flight (default 8); open loop: cap on requests in flight (default 0 = none)."""
    duration: float | None = None
    """Seconds after which no new request is sent (in-flight ones finish); default: until the workload ends."""
    think_time: float = 0.0
    """Seconds between the turns of a session."""
    timeout: float = 300.0
    """Per-request timeout in seconds."""
    cache_salt: str | None = None
    """Send this cache_salt with every request."""
    ignore_eos: bool = True
    """Send ignore_eos (--no-ignore-eos for strict OpenAI servers)."""

    def __post_init__(self) -> None:
        _choice("mode", self.mode, ("open", "closed"))
        if self.duration is not None and not self.duration > 0:
            raise ValueError(f"duration must be > 0 seconds, got {self.duration}")
        if self.rate is not None and not self.rate > 0:
            raise ValueError(f"rate must be > 0 requests/s, got {self.rate}")
        if self.concurrency is not None and (self.concurrency < 0 or (self.mode == "closed" and self.concurrency < 1)):
            raise ValueError(f"concurrency must be >= 1 in closed loop, got {self.concurrency}")

    @property
    def resolved_concurrency(self) -> int:
        """``concurrency``, or its default: 8 sessions in closed loop, no cap in open loop."""
        if self.concurrency is not None:
            return self.concurrency
        return 8 if self.mode == "closed" else 0


@dataclass(frozen=True, slots=True)
class BenchLoadConfig:
    """One load test."""

    endpoint: EndpointOptions = field(default_factory=EndpointOptions)
    """The endpoint under test."""
    workload: WorkloadOptions = field(default_factory=WorkloadOptions)
    """What is sent."""
    shape: WorkloadShape = field(default_factory=lambda: LOAD_SHAPE)
    """How a generated workload shares its prompts (tenants, turns, documents)."""
    load: LoadOptions = field(default_factory=LoadOptions)
    """How it is sent."""

    def flat(self) -> dict[str, object]:
        """Every setting by its field name (the run's ``config`` in the report), the API key left out."""
        out: dict[str, object] = {}
        for section in (self.endpoint, self.workload, self.shape, self.load):
            out.update(dataclasses.asdict(section))
        out.pop("api_key")
        return out


BENCH_LOAD_SCHEMA = Schema(BenchLoadConfig)
