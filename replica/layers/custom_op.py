"""The one dispatch point between a layer's plain-torch reference and its fused Triton kernel.

A ``CustomOp`` layer (vLLM's name) has two implementations of one computation:

    forward_native   plain torch: any device, meta included; the reference the kernels are tested against
    forward_triton   one Triton kernel, registered as a torch op ``torch.ops.kvmesh.<name>``

``forward`` takes the Triton path for CUDA tensors when triton is installed, the native path
otherwise (CPU, meta). Tests pick a path whatever the device with ``force_triton(model, on)``: the
Triton path on CPU tensors runs under Triton's interpreter (``TRITON_INTERPRET=1`` before the first
``import triton``), the native path on CUDA tensors is the reference there.

Each kernel is a torch op rather than a bare launch so that it is one op to the torch profiler,
to a ``TorchDispatchMode`` counting launches, and to ``torch.compile`` / the meta device (its
``Meta`` implementation only allocates outputs). Ops are defined with ``torch.library.Library``
directly (vLLM's ``direct_register_custom_op``, op_registry.py): ~1 us per call, where ``torch.library.custom_op``
adds ~9 us of Python checks to every call of an eager decode step (both measured on the dev VM).
"""

from __future__ import annotations

import functools

import torch
from kvmesh.replica.triton_utils import has_triton
from torch import nn

HAS_TRITON = has_triton()
"""Whether the Triton path can run at all (triton ships with torch's CUDA builds)."""

@functools.cache
def triton_ops():
    """``torch.ops.kvmesh`` with every kernel registered; imports triton on the first call only."""
    from kvmesh.replica.layers import triton_activation, triton_layernorm, triton_rotary  # noqa: F401

    return torch.ops.kvmesh


class CustomOp(nn.Module):
    use_triton: bool | None = None
    """True/False: always the Triton/native path (tests); None: Triton for CUDA tensors when installed."""

    def forward(self, *args, **kwargs):
        if self.uses_triton(args[0]):  # args[0]: the first input tensor
            return self.forward_triton(*args, **kwargs)
        return self.forward_native(*args, **kwargs)

    def uses_triton(self, tensor: torch.Tensor) -> bool:
        """Whether a call on ``tensor`` takes the Triton path."""
        return self.use_triton if self.use_triton is not None else HAS_TRITON and tensor.is_cuda

    def forward_native(self, *args, **kwargs):
        raise NotImplementedError

    def forward_triton(self, *args, **kwargs):
        raise NotImplementedError


def force_triton(model: nn.Module, on: bool | None = True) -> None:
    """Make every ``CustomOp`` in ``model`` take the Triton path (True) or the native path (False) whatever
    the device; None gives the choice back to the device."""
    for module in model.modules():
        if isinstance(module, CustomOp):
            module.use_triton = on
