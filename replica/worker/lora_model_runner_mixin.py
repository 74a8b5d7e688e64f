"""The model runner's LoRA part (vLLM's ``LoRAModelRunnerMixin``): the adapters' manager (replica/lora/), the step's
mapping set around the eager forward, and ``ModelRunnerInterface``'s calls that add, drop and read adapters."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from kvmesh.replica.lora.manager import LoRAManager
from kvmesh.replica.lora.ops import LoRAMapping
from kvmesh.replica.model_config import ModelSpec
from kvmesh.replica.serving.lora_request import LoadedLoRA, LoRARequest


class LoRAModelRunnerMixin:
    lora: LoRAManager | None = None
    """The adapters' device slots and host copies; None: LoRA off."""

    def load_lora_model(self, model: torch.nn.Module, spec: ModelSpec, config, device: torch.device,
                        dtype: torch.dtype) -> None:
        """Wrap the model's projections for adapters (before any graph capture), when ``config.enable_lora``."""
        if config.enable_lora:
            self.lora = LoRAManager(model, spec, model.packed_modules_mapping, config.max_loras, config.max_lora_rank,
                                    config.resolved_max_cpu_loras, device, dtype)

    @contextmanager
    def lora_mapping(self, mapping: LoRAMapping | None) -> Iterator[None]:
        """The forward inside sees which slot each request's tokens use (None: no adapter this step); no later
        forward (a graph capture) sees this step's."""
        if self.lora is None:
            yield
            return
        self.lora.state.mapping = mapping
        try:
            yield
        finally:
            self.lora.state.mapping = None

    def add_lora(self, lora: LoRARequest) -> LoadedLoRA:
        """Read and check an adapter into host memory; its bytes and identity. Raises LoRAError (a ValueError)
        when refused."""
        if self.lora is None:
            raise ValueError("LoRA adapters need enable_lora")
        return self.lora.add_lora(lora)

    def remove_lora(self, lora: LoRARequest) -> bool:
        return self.lora is not None and self.lora.remove_lora(lora)

    def lora_residency(self) -> tuple[list[str], float | None]:
        """Adapters in a device slot, and the measured bytes per second of loads into one (None before any)."""
        return ([], None) if self.lora is None else (self.lora.resident, self.lora.load_bytes_per_s)

    def lora_load_seconds(self) -> float:
        return 0.0 if self.lora is None else self.lora.load_seconds
