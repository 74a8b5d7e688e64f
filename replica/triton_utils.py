"""Whether kvmesh's Triton kernels can run here, and how (compiled on CUDA, interpreted on CPU).

Triton compiles kernels for GPUs only; on CPU tensors a kernel runs through Triton's interpreter,
which must be switched on with ``TRITON_INTERPRET=1`` *before the first ``import triton`` in the
process* (``triton.jit`` -- triton.language's own helpers included -- picks compiled or
interpreted when a function is defined). The test suite sets it in ``tests/conftest.py`` on
machines without a CUDA device; the interpreter computes in numpy, so kernels load bf16/fp16 and
compute in fp32. Importing this module never imports triton eagerly into a failure: without it,
``triton_problem`` says so.
"""

from __future__ import annotations

import importlib.util
import os

import torch


def has_triton() -> bool:
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    """True when triton kernels run through the interpreter (TRITON_INTERPRET set to a true value)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def triton_problem(device: torch.device) -> str | None:
    """Why triton kernels cannot run on ``device``, or None when they can."""
    if not has_triton():
        return "the triton package is not installed (it ships with torch's CUDA wheels; pip install triton)"
    if device.type == "cuda":
        return None
    if device.type == "cpu":
        if interpreting():
            return None
        return ("triton runs on CPU tensors only through its interpreter: set TRITON_INTERPRET=1 before "
                "triton is first imported (slow; meant for tests)")
    return f"triton kernels run on cuda (or cpu through the interpreter) devices, not {device.type}"


def widen_bf16_dots_when_interpreting() -> None:
    """Make the interpreter's ``tl.dot`` read bf16 operands as numbers.

    Triton's interpreter stores bf16 tensors as their uint16 bits (numpy has no bf16) and its ``tl.dot``
    hands those arrays to ``np.matmul`` unconverted, multiplying bit patterns (triton 3.9). Widening each
    bf16 operand to fp32 first is what a bf16 tensor-core MMA with an fp32 accumulator computes: every
    bf16 product is exact in fp32. Called where a kernel module with bf16 dots is imported; a no-op when
    kernels are compiled, and once per process."""
    if not interpreting():
        return
    import triton.language as tl
    from triton.runtime.interpreter import InterpreterBuilder

    original = InterpreterBuilder.create_dot
    if getattr(original, "widens_bf16", False):
        return

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        a, b = (self.cast_impl(x, tl.float32) if x.dtype.scalar == tl.bfloat16 else x for x in (a, b))
        return original(self, a, b, d, input_precision, max_num_imprecise_acc)

    create_dot.widens_bf16 = True
    InterpreterBuilder.create_dot = create_dot


def round_fp8_casts_when_interpreting() -> None:
    """Make the interpreter's casts to FP8 round to nearest even, as the GPU's ``cvt.rn`` does.

    Triton's interpreter narrows floats bit by bit and adds the rounding bit to the mantissa without carrying
    into the exponent (31.8 -> 16 in E4M3, not 32) nor rounding ties to even (triton 3.9). Casts into
    ``float8e4nv``/``float8e5`` (the FP8 KV cache's types) go through torch's conversion instead, which rounds
    as the hardware does. Called where a kernel module that writes FP8 is imported; a no-op when kernels are
    compiled, and once per process."""
    if not interpreting():
        return
    import numpy as np
    import triton.language as tl
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle

    original = InterpreterBuilder.create_fp_to_fp
    if getattr(original, "rounds_fp8", False):
        return
    narrow = {tl.float8e4nv: torch.float8_e4m3fn, tl.float8e5: torch.float8_e5m2}

    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        target = narrow.get(dst_type.scalar)
        if target is None:
            return original(self, src, dst_type, rounding_mode)
        wide = src if src.dtype.scalar == tl.float32 else self.cast_impl(src, tl.float32)
        data = torch.from_numpy(np.ascontiguousarray(wide.data, dtype=np.float32)).to(target)
        return TensorHandle(data.view(torch.uint8).numpy().reshape(np.shape(wide.data)), dst_type.scalar)

    create_fp_to_fp.rounds_fp8 = True
    InterpreterBuilder.create_fp_to_fp = create_fp_to_fp
