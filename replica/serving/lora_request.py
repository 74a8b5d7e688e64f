"""``LoRARequest``: which LoRA adapter a request runs with (vLLM's ``vllm.lora.request.LoRARequest``), torch-free.

The engine, the HTTP layer and the router name an adapter by ``lora_name`` (what a request's ``"model"`` says and
what every block's hash and ``BlockStored.lora_name`` carry); ``lora_int_id`` is the engine's handle for it (> 0,
unique per name on a replica), ``lora_path`` the PEFT directory it loads from (``adapter_config.json`` +
``adapter_model.safetensors``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LoRARequest:
    """One adapter, as vLLM names it."""

    lora_name: str
    """The adapter's served name: a request selects it with ``"model": lora_name``."""
    lora_int_id: int
    """The engine's id for it, > 0 (0 is the base model)."""
    lora_path: str
    """The PEFT directory its weights load from."""

    def __post_init__(self) -> None:
        if not self.lora_name:
            raise ValueError("lora_name must be a non-empty string")
        if self.lora_int_id <= 0:
            raise ValueError(f"lora_int_id must be > 0 (0 is the base model), got {self.lora_int_id}")
