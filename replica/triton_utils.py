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
