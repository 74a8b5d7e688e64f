"""The runner's LoRA state (vLLM's ``LRUCacheWorkerLoRAManager``): the wrapped model, adapters kept in host memory
(``max_cpu_loras``, LRU), the device slots (``max_loras``, LRU) and each step's mapping.

    add_lora ──▶ host cache (read + checked from the PEFT directory)
    a step's adapters ──activate──▶ slots: one not resident is written into a slot (from the host cache, or read
                                    from disk again) before the step's forward, on the compute stream
    InputBatch ──req_slots in the step's one upload──▶ LoRAMapping ──▶ every LoRA layer of the forward

Host copies and slots are per *version* (``LoRARequest.version``: name and identity of the weights), not per name:
an adapter loaded again under its name while requests of the old weights run gets a copy and a slot of its own,
and the old version stays until the engine removes it, when its last request ended (engine/loras.py). The LRU
limit of the host cache (``max_cpu_loras``) gives up only current versions (read again from disk when needed; a
file that changed meanwhile is refused, never served as the version a request started with).

Steps with an adapter run eagerly (no CUDA graph replays them); base-only steps keep their graphs. Activating
an adapter copies its factors (a synchronous host-to-device copy, once per load, not per step).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict

import numpy as np
import torch
from kvmesh.replica.lora.adapter import LoRAAdapter, ShardId, load_adapter
from kvmesh.replica.lora.layers import LoRAStepState, wrap_model
from kvmesh.replica.lora.ops import LoRAMapping
from kvmesh.replica.lora.peft_config import LoRAError
from kvmesh.replica.model_config import ModelSpec
from kvmesh.replica.serving.lora_request import LoadedLoRA, LoRARequest
from kvmesh.replica.triton_utils import triton_problem
from torch import nn

logger = logging.getLogger(__name__)

Version = tuple[str, str]
"""An adapter's name and the identity of its weights (``LoRARequest.version``)."""


class LoRAManager:
    def __init__(self, model: nn.Module, spec: ModelSpec, packed: dict[str, tuple[str, ShardId]], max_loras: int,
                 max_lora_rank: int, max_cpu_loras: int, device: torch.device, dtype: torch.dtype) -> None:
        from kvmesh.replica.lora.slots import LoRASlots

        self.max_loras, self.max_lora_rank, self.max_cpu_loras = max_loras, max_lora_rank, max_cpu_loras
        self.device, self.dtype = device, dtype
        self.state = LoRAStepState(use_triton=device.type == "cuda" and triton_problem(device) is None)
        self.targets = wrap_model(model, spec, packed, max_loras, max_lora_rank, self.state)
        self.host: OrderedDict[Version, LoRAAdapter] = OrderedDict()  # least recently used first
        self.current: dict[str, Version] = {}  # each name's newest version (older ones wait for their requests)
        self.slots = LoRASlots(max_loras)
        self.bytes_loaded = 0
        self.load_seconds = 0.0
        self.warm_up()

    # -- adapters in host memory -----------------------------------------------------------------------

    def add_lora(self, lora: LoRARequest) -> LoadedLoRA:
        """Read and check ``lora`` into the host cache, as its name's current version (an older version stays for
        the requests that run with it); its bytes and identity. Raises ``LoRAError`` when it cannot be served."""
        adapter = load_adapter(lora, self.targets, self.max_lora_rank, self.dtype, pin=self.device.type == "cuda")
        version = (lora.lora_name, adapter.identity)
        self.current[lora.lora_name] = version
        self._keep(version, adapter)
        return LoadedLoRA(adapter.nbytes, adapter.identity)

    def remove_lora(self, lora: LoRARequest) -> bool:
        """Forget version ``lora`` (the engine's registered copy, with its identity): its host copy and slot; False
        when it held neither."""
        version = lora.version
        if self.current.get(lora.lora_name) == version:
            del self.current[lora.lora_name]
        in_host = self.host.pop(version, None) is not None
        return self.slots.release(version) is not None or in_host

    def _host_adapter(self, lora: LoRARequest) -> LoRAAdapter:
        version = self._version(lora)
        adapter = self.host.get(version)
        if adapter is not None:
            self.host.move_to_end(version)
            return adapter
        adapter = load_adapter(lora, self.targets, self.max_lora_rank, self.dtype, pin=self.device.type == "cuda")
        if version[1] != adapter.identity and lora.identity is not None:
            raise LoRAError(f"LoRA adapter {lora.lora_name!r}: the files at {lora.lora_path} changed since it was "
                            f"loaded (weights {lora.identity}, now {adapter.identity}); load it again to serve them")
        self._keep(version, adapter)
        return adapter

    def _version(self, lora: LoRARequest) -> Version:
        """``lora.version``; a request that names an adapter without its identity runs with its name's current one."""
        if lora.identity is None and lora.lora_name in self.current:
            return self.current[lora.lora_name]
        return lora.version

    def _keep(self, version: Version, adapter: LoRAAdapter) -> None:
        self.host[version] = adapter
        self.host.move_to_end(version)
        over = len(self.host) - self.max_cpu_loras
        if over > 0:  # least recently used current versions first; older versions wait for their requests
            for old in [v for v in self.host if v != version and self.current.get(v[0]) == v][:over]:
                del self.host[old]

    @property
    def resident(self) -> list[str]:
        """Adapters in a device slot (by name)."""
        return list(dict.fromkeys(name for name, _ in self.slots.resident))

    @property
    def load_bytes_per_s(self) -> float | None:
        """Bytes per second of loads into a slot so far (disk reads included), None before the first."""
        return self.bytes_loaded / self.load_seconds if self.load_seconds > 0 else None

    # -- a step ----------------------------------------------------------------------------------------

    def activate(self, loras: list[LoRARequest]) -> list[int]:
        """Put the step's distinct adapter versions into slots (loading those not resident); each one's slot."""
        versions = [self._version(lora) for lora in loras]
        slot_of, to_load = self.slots.assign(versions)
        by_version = dict(zip(versions, loras, strict=True))
        for version, slot in to_load:
            start = time.perf_counter()
            adapter = self._host_adapter(by_version[version])
            for path, layer in self.state.layers.items():
                layer.set_slot(slot, self._on_device(adapter.weights.get(path)))
            self.bytes_loaded += adapter.nbytes
            self.load_seconds += time.perf_counter() - start
            logger.info("LoRA adapter %r (weights %s) loaded into slot %d (%d bytes)", version[0], version[1], slot,
                        adapter.nbytes)
        return [slot_of[v] for v in versions]

    def _on_device(self, weights: dict[ShardId, tuple[torch.Tensor, torch.Tensor]] | None
                   ) -> dict[ShardId, tuple[torch.Tensor, torch.Tensor]] | None:
        """A layer's factors on the device: from pinned host memory without blocking (stream-ordered before the
        step's forward), so writing a slot is device-to-device."""
        if weights is None or self.device.type == "cpu":
            return weights
        return {sid: (a.to(self.device, non_blocking=True), b.to(self.device, non_blocking=True))
                for sid, (a, b) in weights.items()}

    def warm_up(self) -> None:
        """Compile the Triton kernels' specializations (every layer shape, shrink and expand) before the first
        adapter step: one token of slot 0 through every LoRA layer (CUDA only; nothing compiles off it)."""
        if not self.state.use_triton:
            return
        from kvmesh.replica.lora.triton_lora import lora_update_triton

        qsl = torch.tensor([0, 1], dtype=torch.int32, device=self.device)
        slots = torch.zeros(1, dtype=torch.int32, device=self.device)
        for layer in self.state.layers.values():
            x = torch.zeros(1, layer.lora_a.shape[2], dtype=self.dtype, device=self.device)  # [1, in]
            y = torch.zeros(1, layer.lora_b.shape[1], dtype=self.dtype, device=self.device)  # [1, out]
            lora_update_triton(y, x, layer.lora_a, layer.lora_b, qsl, slots, 1, 1)

    def mapping(self, req_slots: np.ndarray, query_lens: np.ndarray, req_slots_device: torch.Tensor,
                query_start_loc: torch.Tensor) -> LoRAMapping:
        """The step's ``LoRAMapping``: ``req_slots`` [n] (-1: base) and ``query_lens`` [n] on the host, their device
        twins from the step's one upload."""
        groups: list[tuple[int, torch.Tensor]] = []
        if not self.state.use_triton:  # the torch path groups tokens by slot on the host
            token_slots = np.repeat(req_slots, query_lens)
            for slot in np.unique(req_slots[req_slots >= 0]).tolist():
                groups.append((slot, torch.from_numpy(np.flatnonzero(token_slots == slot)).to(self.device)))
        return LoRAMapping(req_slots_device, query_start_loc, len(req_slots), int(query_lens.max()), groups)
