"""The simulated replicas' LoRA settings (``SimConfig.lora``; what they do: sim/lora.py)."""

from __future__ import annotations

from dataclasses import dataclass

ADAPTER_AFFINITY_MODES: dict[str, dict[str, bool]] = {
    "on": {"/adapter-aware": True}, "off": {"/adapter-blind": False},
    "both": {"/adapter-aware": True, "/adapter-blind": False}}
"""``--adapter-affinity`` mode -> {label suffix: whether the router is adapter-aware}."""


@dataclass(frozen=True, slots=True)
class SimLoRAConfig:
    """The simulated replicas' LoRA slots and how the router sees adapters."""

    max_loras: int = 4
    """Distinct LoRA adapters one step may batch (device slots per replica, vLLM's --max-loras)."""
    max_lora_rank: int = 16
    """Largest adapter rank, as the replicas report it."""
    lora_bytes: int = 83_886_080
    """Bytes of one adapter's weights: rank 16 on every projection of an 8B Llama-3 in bf16 (~84 MB)."""
    lora_load_bytes_per_s: float = 10e9
    """Bytes per second of an adapter's load into a device slot (host memory to GPU with its set-up)."""
    adapter_aware: bool = True
    """The router gets each request's lora_name and the replicas' /load lora section (False: adapter-blind)."""

    def __post_init__(self) -> None:
        if self.max_loras < 1 or self.max_lora_rank < 1:
            raise ValueError(f"max_loras and max_lora_rank must be >= 1, got {self.max_loras} and {self.max_lora_rank}")
        if self.lora_bytes < 0:
            raise ValueError(f"lora_bytes must be >= 0, got {self.lora_bytes}")
        if not self.lora_load_bytes_per_s > 0:
            raise ValueError(f"lora_load_bytes_per_s must be > 0 bytes per second, got {self.lora_load_bytes_per_s}")

    @property
    def load_s(self) -> float:
        """Seconds one adapter's load into a slot takes."""
        return self.lora_bytes / self.lora_load_bytes_per_s
