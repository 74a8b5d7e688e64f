"""Options of ``kvmesh bench engine-speed``: one dataclass, one doc line per field; the flags derive from it."""

from __future__ import annotations

from dataclasses import dataclass

from kvmesh.cluster.measure.benchmarks.engine_speed.presets import PRESETS
from kvmesh.cluster.measure.benchmarks.engine_speed.variants import EngineVariant, parse_variants

DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class EngineSpeedOptions:
    """What to measure, on which device, with which model."""

    device: str = "auto"
    """Where the engines run: cpu, cuda, or auto (cuda when torch sees one)."""
    preset: str | None = None
    """Model shape and workload size: tiny or tinyllama-1.1b; default tinyllama-1.1b on cuda, tiny on cpu."""
    model: str | None = None
    """A Hugging Face model directory to use instead of the preset's random bf16 weights."""
    model_cache_dir: str = "~/.cache/kvmesh/bench-models"
    """Where the preset's random weights are made once (<dir>/<preset>/ config.json + safetensors)."""
    configs: str = ""
    """Comma-separated engine configurations to run after the default one: backend:block_size[:graphs]."""
    num_requests: int | None = None
    """Requests of the throughput workload, all submitted at once (default: the preset's)."""
    decode_batches: str | None = None
    """Comma-separated running-sequence counts at which decode steps are timed (default: the preset's)."""
    decode_steps: int = 20
    """Timed decode steps per batch size, after the warm-up steps."""
    warmup_steps: int = 3
    """Untimed decode steps before the timed ones."""
    ttft_prefix_len: int | None = None
    """Prefix tokens of the TTFT measurement, 16 new tokens follow (default: the preset's)."""
    ttft_repeats: int = 5
    """TTFT measurements (cold, then cached) per configuration, each with a fresh prefix; medians reported."""
    hf_batch_size: int | None = None
    """Static batch size of the Hugging Face generate baseline (default: the preset's)."""
    skip_hf: bool = False
    """Do not run the Hugging Face generate baseline."""
    gpu_memory_utilization: float = 0.85
    """Fraction of GPU memory one engine may use (weights, activations, KV cache) on cuda."""
    kv_cache_memory: str = "1GiB"
    """KV cache of one engine on cpu (on cuda gpu_memory_utilization sizes it)."""
    max_num_batched_tokens: int | None = None
    """Token budget of one engine step (default: the preset's)."""
    seed: int = 0
    """Seed of the random weights and the random token ids."""
    out: str | None = None
    """Results JSON (a PNG is written beside it); default results/engine_<device>.json."""

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(f"--device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if self.preset is not None and self.preset not in PRESETS:
            raise ValueError(f"--preset must be one of {', '.join(PRESETS)}, got {self.preset!r}")
        for name in ("num_requests", "ttft_prefix_len", "hf_batch_size", "max_num_batched_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
        for name in ("decode_steps", "ttft_repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.warmup_steps < 0:
            raise ValueError(f"--warmup-steps must be >= 0, got {self.warmup_steps}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"--gpu-memory-utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        from kvmesh.replica.config import parse_size

        parse_size(self.kv_cache_memory, "--kv-cache-memory")
        self.batches()
        self.variants()

    def variants(self) -> list[EngineVariant]:
        """The explicit configurations (the default one is run first on top of these)."""
        from kvmesh.replica.attention.backend import available_backends

        return parse_variants(self.configs, available_backends())

    def batches(self) -> tuple[int, ...] | None:
        """``decode_batches`` parsed, or None for the preset's."""
        if self.decode_batches is None:
            return None
        items = [s.strip() for s in self.decode_batches.split(",") if s.strip()]
        if not items or not all(s.isdigit() and int(s) >= 1 for s in items):
            raise ValueError(f"--decode-batches must be comma-separated positive integers such as 1,64,256, "
                             f"got {self.decode_batches!r}")
        return tuple(int(s) for s in items)
