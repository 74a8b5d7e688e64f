"""LoRA wrappers of the linear layers (vLLM's ``*WithLoRA``): the base layer's output plus the gathered update.

Each wrapper holds every device slot's factors, stacked, zero-padded to ``max_lora_rank`` per slice::

    lora_a  [max_loras, n_slices * R, in_local]     lora_b  [max_loras, out_local, n_slices * R]

A fused layer (qkv_proj: q, k, v; gate_up_proj: gate, up) keeps slice i's A in rows ``[i R, i R + r)`` and its B
in columns ``[i R, i R + r)`` over that slice's own output rows: B is block-diagonal, so one shrink and one
expand cover every slice. Tensor parallelism shards the factors like the layer they adapt, through the base
layer's own ``weight_loader``: column-parallel (qkv, gate_up) B by output rows, A whole; row-parallel (o, down) A
by input columns, B whole, the update added to the partial output before the all-reduce (the sum over ranks of
``(x_r A_r^T) B^T`` is ``x A^T B^T``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from kvmesh.replica.layers.linear import ColumnParallelLinear, LinearBase, RowParallelLinear
from kvmesh.replica.lora.adapter import LoRATarget, ShardId
from kvmesh.replica.lora.ops import LoRAMapping, lora_update
from kvmesh.replica.model_config import ModelSpec
from torch import nn


@dataclass(slots=True)
class LoRAStepState:
    """Shared by every LoRA layer of a model: the current step's mapping (None: no adapter in the step)."""

    mapping: LoRAMapping | None = None
    use_triton: bool = False
    """The update runs the Triton kernels (CUDA) rather than the torch path."""
    layers: dict[str, LoRALinear] = field(default_factory=dict)
    """Every wrapped layer by its module path."""


class LoRALinear(nn.Module):
    """A column- or row-parallel linear layer with per-slot LoRA factors."""

    def __init__(self, base: LinearBase, shard_ids: list[ShardId], max_loras: int, max_rank: int,
                 state: LoRAStepState) -> None:
        super().__init__()
        self.base, self.shard_ids, self.max_rank, self.state = base, shard_ids, max_rank, state
        self.row_parallel = isinstance(base, RowParallelLinear)
        out_local, in_local = base.weight.shape
        width = len(shard_ids) * max_rank
        w = base.weight
        self.register_buffer("lora_a", torch.zeros(max_loras, width, in_local, dtype=w.dtype, device=w.device))
        self.register_buffer("lora_b", torch.zeros(max_loras, out_local, width, dtype=w.dtype, device=w.device))

    def set_slot(self, slot: int, weights: dict[ShardId, tuple[torch.Tensor, torch.Tensor]] | None) -> None:
        """Write an adapter's factors of this layer into ``slot`` (None or a missing slice: zeros)."""
        self.lora_a[slot].zero_()
        self.lora_b[slot].zero_()
        for i, shard_id in enumerate(self.shard_ids):
            if weights is None or shard_id not in weights:
                continue
            a, b = weights[shard_id]  # [r, in], [out, r]: whole, as the checkpoint has them
            cols = slice(i * self.max_rank, i * self.max_rank + a.shape[0])
            if self.row_parallel:  # A split by input like the weight; B whole
                self.base.weight_loader(self.lora_a[slot, cols], a)
                self.lora_b[slot, :, cols].copy_(b)
            else:  # A whole; B split by output like the weight (its slice's rows of this rank)
                self.lora_a[slot, cols].copy_(a)
                if shard_id is None:
                    self.base.weight_loader(self.lora_b[slot, :, cols], b)
                else:
                    self.base.weight_loader(self.lora_b[slot, :, cols], b, shard_id)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mapping, base = self.state.mapping, self.base
        if not self.row_parallel:
            y = base(x)  # [T, out_local]
            if mapping is not None:
                lora_update(y, x, self.lora_a, self.lora_b, mapping, self.state.use_triton)
            return y
        y = F.linear(x, base.weight, base.bias if base.tp_rank == 0 else None)  # [T, out] partial sum
        if mapping is not None:
            lora_update(y, x, self.lora_a, self.lora_b, mapping, self.state.use_triton)
        return base.parallel.all_reduce(y)


def _projection_shapes(spec: ModelSpec) -> dict[str, tuple[int, int]]:
    """PEFT module name -> (in, out) of the whole (unsharded) projection."""
    h, q, kv, i = (spec.hidden_size, spec.num_attention_heads * spec.head_dim,
                   spec.num_key_value_heads * spec.head_dim, spec.intermediate_size)
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}


def wrap_model(model: nn.Module, spec: ModelSpec, packed: dict[str, tuple[str, ShardId]], max_loras: int,
               max_rank: int, state: LoRAStepState) -> dict[str, LoRATarget]:
    """Replace every adaptable projection of ``model`` by its LoRA wrapper (in place); returns the PEFT module
    paths (``model.layers.0.self_attn.q_proj``) -> where their factors go. ``packed`` is the model's
    ``packed_modules_mapping`` (HF name -> (fused module, shard id))."""
    shapes = _projection_shapes(spec)
    slices: dict[str, list[tuple[str, ShardId]]] = {}
    for hf_name, (fused, shard_id) in packed.items():
        slices.setdefault(fused, []).append((hf_name, shard_id))
    targets: dict[str, LoRATarget] = {}
    for path, module in list(model.named_modules()):
        parent_path, _, name = path.rpartition(".")
        if not isinstance(module, ColumnParallelLinear | RowParallelLinear):
            continue
        parts = slices.get(name, [(name, None)] if name in shapes else [])
        if not parts:
            continue
        wrapper = LoRALinear(module, [sid for _, sid in parts], max_loras, max_rank, state)
        setattr(model.get_submodule(parent_path), name, wrapper)
        state.layers[path] = wrapper
        for hf_name, shard_id in parts:
            d_in, d_out = shapes[hf_name]
            targets[f"{parent_path}.{hf_name}"] = LoRATarget(path, shard_id, d_in, d_out)
    return targets
