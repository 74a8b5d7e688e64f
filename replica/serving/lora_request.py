"""``LoRARequest``: which LoRA adapter a request runs with (vLLM's ``vllm.lora.request.LoRARequest``), torch-free.

The engine, the HTTP layer and the router name an adapter by ``lora_name`` (what a request's ``"model"`` says and
what every block's hash and ``BlockStored.lora_name`` carry); ``lora_int_id`` is the engine's handle for it (> 0,
unique per name on a replica), ``lora_path`` the PEFT directory it loads from (``adapter_config.json`` +
``adapter_model.safetensors``). ``identity`` is a digest of the weights and scale the engine read (set when it
registers the adapter): it keys the adapter's blocks after its name, so a name loaded again from other weights
never meets the old weights' KV, and two replicas that loaded the same files share blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class LoRARequest:
    """One adapter, as vLLM names it."""

    lora_name: str
    """The adapter's served name: a request selects it with ``"model": lora_name``."""
    lora_int_id: int
    """The engine's id for it, > 0 (0 is the base model)."""
    lora_path: str
    """The PEFT directory its weights load from."""
    identity: str | None = field(default=None, compare=False)
    """A digest of the weights and scale the engine read (``LoadedLoRA.identity``); None until registered. Not
    compared: a request naming the adapter by name, id and path names the registered one."""

    @property
    def version(self) -> tuple[str, str]:
        """Which weights of the adapter: its name and identity (its id and path until it is registered). A request
        keeps the version it started with to its end, whatever is loaded under its name meanwhile: the runner's
        host copies and device slots, and the scheduler's ``max_loras`` count, are per version."""
        return self.lora_name, self.identity if self.identity is not None else f"{self.lora_int_id}:{self.lora_path}"

    def __post_init__(self) -> None:
        if not self.lora_name:
            raise ValueError("lora_name must be a non-empty string")
        if self.lora_int_id <= 0:
            raise ValueError(f"lora_int_id must be > 0 (0 is the base model), got {self.lora_int_id}")


@dataclass(frozen=True, slots=True)
class LoadedLoRA:
    """What reading an adapter gave (``ModelRunnerInterface.add_lora``)."""

    nbytes: int
    """Bytes of its factors (what a load into a device slot moves)."""
    identity: str
    """A digest of its tensors (names, dtypes, shapes, bytes) and scale: the same files give the same identity on
    every replica; other weights or another ``lora_alpha`` give another."""
