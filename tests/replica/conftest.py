"""Replica test fixtures: where Triton kernels run in tests.

``TRITON_INTERPRET=1`` must be in the environment before the first ``import triton`` of the process,
so it is set here, when pytest loads this conftest (before any test module under tests/replica is
imported) -- and only where no GPU is visible: with one, kernel tests run the compiled kernels on it.
The interpreter runs kernels on CPU tensors with numpy; compute in float32 inside kernels (its bf16
casts round toward zero, so bf16 results differ from a GPU's by up to one unit in the last place).
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

HAS_TRITON = importlib.util.find_spec("triton") is not None

if HAS_TRITON and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def triton_device() -> torch.device:
    """The device Triton kernels run on here: the GPU if there is one, else the CPU through Triton's
    interpreter. Skips when triton is not installed (``pip install -e .[dev]`` brings it)."""
    if not HAS_TRITON:
        pytest.skip("triton is not installed (pip install -e '.[dev]'); the Triton kernels cannot run")
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
