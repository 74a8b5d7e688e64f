"""The runner's LoRA state (vLLM's ``LRUCacheWorkerLoRAManager``): the wrapped model, adapters kept in host memory
(``max_cpu_loras``, LRU), the device slots (``max_loras``, LRU) and each step's mapping.

    add_lora ──▶ host cache (read + checked from the PEFT directory)
    a step's adapters ──activate──▶ slots: one not resident is written into a slot (from the host cache, or read
                                    from disk again) before the step's forward, on the compute stream
    InputBatch ──req_slots in the step's one upload──▶ LoRAMapping ──▶ every LoRA layer of the forward

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
from kvmesh.replica.model_config import ModelSpec
from kvmesh.replica.serving.lora_request import LoadedLoRA, LoRARequest
from kvmesh.replica.triton_utils import triton_problem
from torch import nn

logger = logging.getLogger(__name__)


class LoRAManager:
    def __init__(self, model: nn.Module, spec: ModelSpec, packed: dict[str, tuple[str, ShardId]], max_loras: int,
                 max_lora_rank: int, max_cpu_loras: int, device: torch.device, dtype: torch.dtype) -> None:
        from kvmesh.replica.lora.slots import LoRASlots

        self.max_loras, self.max_lora_rank, self.max_cpu_loras = max_loras, max_lora_rank, max_cpu_loras
        self.device, self.dtype = device, dtype
        self.state = LoRAStepState(use_triton=device.type == "cuda" and triton_problem(device) is None)
        self.targets = wrap_model(model, spec, packed, max_loras, max_lora_rank, self.state)
        self.host: OrderedDict[str, LoRAAdapter] = OrderedDict()  # least recently used first
        self.slots = LoRASlots(max_loras)
        self._in_slot: dict[str, LoRARequest] = {}  # which version of an adapter each slot holds
        self.bytes_loaded = 0
        self.load_seconds = 0.0
        self.warm_up()

    # -- adapters in host memory -----------------------------------------------------------------------

    def add_lora(self, lora: LoRARequest) -> LoadedLoRA:
        """Read and check ``lora`` into the host cache (replacing another version of the name); its bytes and
        identity. Raises ``LoRAError`` when it cannot be served."""
        adapter = self._host_adapter(lora, reload=True)
        return LoadedLoRA(adapter.nbytes, adapter.identity)

    def remove_lora(self, name: str) -> bool:
        """Forget ``name`` in host memory and its slot; False when it was in neither."""
        in_host = self.host.pop(name, None) is not None
        self._in_slot.pop(name, None)
        return self.slots.release(name) is not None or in_host

    def _host_adapter(self, lora: LoRARequest, reload: bool = False) -> LoRAAdapter:
        adapter = self.host.get(lora.lora_name)
        if adapter is not None and adapter.lora == lora and not reload:
            self.host.move_to_end(lora.lora_name)
            return adapter
        adapter = load_adapter(lora, self.targets, self.max_lora_rank, self.dtype, pin=self.device.type == "cuda")
        if self.host.pop(lora.lora_name, None) is not None and lora.lora_name in self._in_slot:
            self._in_slot.pop(lora.lora_name)
            self.slots.release(lora.lora_name)  # a new version: its slot is stale
        self.host[lora.lora_name] = adapter
        while len(self.host) > self.max_cpu_loras:
            self.host.popitem(last=False)
        return adapter

    @property
    def resident(self) -> list[str]:
        """Adapters in a device slot."""
        return self.slots.resident

    @property
    def load_bytes_per_s(self) -> float | None:
        """Bytes per second of loads into a slot so far (disk reads included), None before the first."""
        return self.bytes_loaded / self.load_seconds if self.load_seconds > 0 else None

    # -- a step ----------------------------------------------------------------------------------------

    def activate(self, loras: list[LoRARequest]) -> dict[int, int]:
        """Put the step's distinct adapters into slots (loading those not resident); lora_int_id -> slot."""
        for lora in loras:
            held = self._in_slot.get(lora.lora_name)
            if held is not None and held != lora:  # re-registered under another path or id: reload
                self._in_slot.pop(lora.lora_name)
                self.slots.release(lora.lora_name)
        slot_of, to_load = self.slots.assign([lora.lora_name for lora in loras])
        by_name = {lora.lora_name: lora for lora in loras}
        for name, slot in to_load:
            start = time.perf_counter()
            adapter = self._host_adapter(by_name[name])
            for path, layer in self.state.layers.items():
                layer.set_slot(slot, self._on_device(adapter.weights.get(path)))
            self._in_slot[name] = by_name[name]
            self.bytes_loaded += adapter.nbytes
            self.load_seconds += time.perf_counter() - start
            logger.info("LoRA adapter %r loaded into slot %d (%d bytes)", name, slot, adapter.nbytes)
        return {lora.lora_int_id: slot_of[lora.lora_name] for lora in loras}

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
