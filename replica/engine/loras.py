"""The engine's LoRA adapters (vLLM's ``add_lora`` / ``remove_lora`` / ``list_loras``): which adapters are known,
their bytes, and ``/load``'s ``lora`` section. The weights live in the runner (replica/lora/); this is the
engine thread's registry, torch-free.

    EngineConfig.lora_modules ──at start──▶ add()  ◀── LLMEngine.add_lora / AsyncLLM.add_lora (/v1/load_lora_adapter)
    add_request(lora_request=...) ──resolve()──▶ Request.lora_request (keys its blocks, rides to the runner)

The runner's read gives the adapter's identity (a digest of its weights and scale); the registered ``LoRARequest``
carries it, and every request of the adapter runs with the registered one, so its blocks are keyed by name and
identity: unloaded and loaded again from other weights, the name never meets the old weights' blocks.

A request keeps the version it started with: ``remove`` unregisters the name at once (new requests cannot name
it), but the runner keeps the version's weights (its host copy and device slot) while requests run with it;
``drop_retired``, after each step, lets the runner forget the versions whose last request ended.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING

from kvmesh.replica.config import EngineConfig
from kvmesh.replica.interfaces import ModelRunnerInterface
from kvmesh.replica.serving.load_report import LoRALoad
from kvmesh.replica.serving.lora_request import LoRARequest

if TYPE_CHECKING:
    from kvmesh.replica.engine.request import Request


class EngineLoRAs:
    """Adapters known to one engine, by name; registering one reads and checks it in the runner."""

    def __init__(self, config: EngineConfig, runner: ModelRunnerInterface) -> None:
        self.enabled, self.max_loras, self.max_lora_rank = config.enable_lora, config.max_loras, config.max_lora_rank
        self.runner = runner
        self.registered: dict[str, LoRARequest] = {}
        self.nbytes: dict[str, int] = {}
        self.retired: list[LoRARequest] = []
        """Versions removed while requests ran with them: the runner keeps their weights until those end."""
        for name, path in (config.lora_modules or {}).items():
            self.add(LoRARequest(name, self.next_id(), path))

    def next_id(self) -> int:
        """A ``lora_int_id`` no registered adapter has."""
        return max((lora.lora_int_id for lora in self.registered.values()), default=0) + 1

    def add(self, lora: LoRARequest) -> bool:
        """Register ``lora`` (read and checked by the runner); False when it is registered already as it is.
        Raises ValueError (``LoRAError``) saying why an adapter cannot be served, or that another adapter has
        its name (vLLM's rule: remove that one first)."""
        if not self.enabled:
            raise ValueError(f"LoRA adapter {lora.lora_name!r}: this engine serves no adapters; start it with "
                             "enable_lora (--enable-lora)")
        known = self.registered.get(lora.lora_name)
        if known == lora:
            return False
        if known is not None:
            raise ValueError(f"LoRA adapter {lora.lora_name!r} is registered already as {known}; remove it first "
                             "to load another under that name")
        clash = next((o for o in self.registered.values()
                      if o.lora_int_id == lora.lora_int_id and o.lora_name != lora.lora_name), None)
        if clash is not None:
            raise ValueError(f"LoRA adapter {lora.lora_name!r}: lora_int_id {lora.lora_int_id} is adapter "
                             f"{clash.lora_name!r}'s; give each adapter its own id")
        loaded = self.runner.add_lora(lora)
        self.nbytes[lora.lora_name] = loaded.nbytes
        self.registered[lora.lora_name] = dataclasses.replace(lora, identity=loaded.identity)
        return True

    def remove(self, name: str, requests: Iterable[Request]) -> bool:
        """Forget adapter ``name``: new requests cannot name it, ``requests`` (the engine's unfinished ones)
        finish with its weights; False when unknown."""
        lora = self.registered.pop(name, None)
        if lora is None:
            return False
        self.nbytes.pop(name, None)
        self.retired.append(lora)
        self.drop_retired(requests)
        return True

    def drop_retired(self, requests: Iterable[Request]) -> None:
        """Let the runner forget each retired version no request of ``requests`` (the unfinished ones) runs with."""
        running = {r.lora_request.version for r in requests if r.lora_request is not None}
        current = {lora.version for lora in self.registered.values()}
        kept = []
        for lora in self.retired:
            if lora.version in current:  # loaded again from the same files: the registered version now
                continue
            if lora.version in running:
                kept.append(lora)
            else:
                self.runner.remove_lora(lora)
        self.retired = kept

    def resolve(self, lora: LoRARequest | None) -> LoRARequest | None:
        """The adapter a new request runs with (the registered one: with its identity): registered on first use
        (vLLM's), refused when it differs from the registered adapter of that name or names other weights."""
        if lora is None:
            return None
        known = self.registered.get(lora.lora_name)
        if known is None:
            self.add(lora)
        elif known != lora or lora.identity not in (None, known.identity):
            raise ValueError(f"LoRA adapter {lora.lora_name!r} is registered as {known} (weights {known.identity}); "
                             f"a request named it as {lora} (weights {lora.identity})")
        return self.registered[lora.lora_name]

    def load(self, running_names: Iterable[str | None]) -> LoRALoad:
        """``/load``'s ``lora`` section (read off the engine thread: copies, never iterated live)."""
        if not self.enabled:
            return LoRALoad()
        resident, rate = self.runner.lora_residency()
        return LoRALoad(enabled=True, max_loras=self.max_loras, max_lora_rank=self.max_lora_rank,
                        adapters=dict(self.nbytes), resident=list(resident),
                        identities={name: lora.identity for name, lora in list(self.registered.items())
                                    if lora.identity is not None},
                        active=sorted({n for n in running_names if n is not None}), load_bytes_per_s=rate)
