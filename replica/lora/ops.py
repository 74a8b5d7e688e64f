"""The gathered low-rank update of one step (punica / S-LoRA): ``y += (x @ A[slot].T) @ B[slot].T`` per token.

A step's tokens are grouped by request (``query_start_loc``) and each request has one slot (-1: the base model,
no update). ``LoRAMapping`` is that step's description, built by the runner's ``LoRAManager`` from the step's one
upload; the LoRA layers read it. The torch path (CPU, and the reference) groups tokens by slot on the host; the
Triton path (CUDA, triton_lora.py) reads the mapping on the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class LoRAMapping:
    """Which adapter slot each request of a step uses."""

    req_slots: torch.Tensor
    """[n] int32 on the device: the slot of each request of the step (-1: base model)."""
    query_start_loc: torch.Tensor
    """[n + 1] int32 on the device: request i's tokens are ``[query_start_loc[i], query_start_loc[i+1])``."""
    num_reqs: int
    max_query_len: int
    token_groups: list[tuple[int, torch.Tensor]]
    """The torch path's host-side grouping: (slot, token indices [k] int64 on the device), one per slot used
    (empty when the Triton path runs)."""


def lora_update_torch(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                      groups: list[tuple[int, torch.Tensor]]) -> None:
    """y [T, out] += (x [T, in] @ A[s].T) @ B[s].T for the tokens of each slot s; A [S, R, in], B [S, out, R]."""
    for slot, tokens in groups:
        xs = x.index_select(0, tokens)  # [k, in]
        y.index_add_(0, tokens, (xs @ a[slot].T) @ b[slot].T)


def lora_update(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, mapping: LoRAMapping,
                use_triton: bool) -> None:
    """The update of one layer for the step of ``mapping``, on the path the runner chose."""
    if use_triton:
        from kvmesh.replica.lora.triton_lora import lora_update_triton

        lora_update_triton(y, x, a, b, mapping.query_start_loc, mapping.req_slots, mapping.num_reqs,
                           mapping.max_query_len)
    else:
        lora_update_torch(y, x, a, b, mapping.token_groups)
