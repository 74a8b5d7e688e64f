"""What one replica serves (``ServedModels``), as router/routing/model_pools.py's catalog reads it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class ServedModels:
    """What one replica serves (its ``/v1/models``; adapters also from ``/load``)."""

    base: str
    """The served name of its base model (the ``/v1/models`` entry without a ``parent``)."""
    root: str | None = None
    """The path or hub id it loaded the base from (vLLM's ``root``); a path adds aliases."""
    adapters: dict[str, str | None] = field(default_factory=dict)
    """LoRA adapters it has: name -> the path it loaded it from (None: not reported)."""
    identities: dict[str, str] = field(default_factory=dict)
    """Adapter -> the identity of the weights it read (``/load``'s ``lora.identities``; absent: not reported)."""
