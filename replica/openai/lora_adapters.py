"""vLLM's runtime LoRA API bodies, torch-free (the replica serves them; the router sends them with the internal key).

    POST /v1/load_lora_adapter     {"lora_name": str, "lora_path": str}   -> 200 "Success: LoRA adapter ..."
    POST /v1/unload_lora_adapter   {"lora_name": str}                     -> 200 "Success: LoRA adapter ..."

Both are the admin plane (replica/server/lora_models.py has who may call them and every error).
"""

from __future__ import annotations

from typing import Annotated

from kvmesh.replica.openai.responses import OpenAIBaseModel
from pydantic import Field

LOAD_LORA_PATH = "/v1/load_lora_adapter"
UNLOAD_LORA_PATH = "/v1/unload_lora_adapter"
LORA_ADMIN_PATHS = frozenset({LOAD_LORA_PATH, UNLOAD_LORA_PATH})
"""The replica's admin plane: the admin key or the internal key, never the tenants' API key."""

Name = Annotated[str, Field(strict=True, min_length=1, max_length=256)]
"""An adapter's served name: a non-empty JSON string (what requests put in ``"model"``)."""
Path = Annotated[str, Field(strict=True, min_length=1, max_length=4096)]
"""A PEFT directory on the replica's host."""


class LoadLoRAAdapterRequest(OpenAIBaseModel):
    """``POST /v1/load_lora_adapter`` (vLLM's body)."""

    lora_name: Name
    """The name requests will select it by (``"model": lora_name``)."""
    lora_path: Path
    """The PEFT directory to load (``adapter_config.json`` + ``adapter_model.safetensors``)."""


class UnloadLoRAAdapterRequest(OpenAIBaseModel):
    """``POST /v1/unload_lora_adapter`` (vLLM's body; vLLM's optional ``lora_int_id`` is accepted and not read)."""

    lora_name: Name
    """The adapter to unload."""
