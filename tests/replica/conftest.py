"""Replica test fixtures: where Triton kernels run in tests.

Without a GPU the kernels run on CPU tensors through Triton's interpreter: ``TRITON_INTERPRET=1`` is
set by tests/conftest.py, the first file pytest loads (it must precede the first ``import triton``).
With a GPU, kernel tests run the compiled kernels on it. The interpreter computes with numpy;
compute in float32 inside kernels (its bf16 casts round toward zero, so bf16 results differ from a
GPU's by up to one unit in the last place).
"""

from __future__ import annotations

import pytest
import torch
from kvmesh.replica.triton_utils import has_triton


@pytest.fixture(scope="session")
def triton_device() -> torch.device:
    """The device Triton kernels run on here: the GPU if there is one, else the CPU through Triton's
    interpreter. Skips when triton is not installed (``pip install -e .[dev]`` brings it)."""
    if not has_triton():
        pytest.skip("triton is not installed (pip install -e '.[dev]'); the Triton kernels cannot run")
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(scope="session")
def perturbed_draft(stories_path, tmp_path_factory):
    """stories260K with noise on its weights: a draft model whose drafts are mostly rejected (draft_models.py)."""
    from .draft_models import perturbed_copy

    return perturbed_copy(stories_path, tmp_path_factory.mktemp("draft") / "perturbed")


@pytest.fixture(scope="session")
def two_layer_stories(stories_path, tmp_path_factory):
    """stories260K cut to its first 2 decoder layers (draft_models.py): for engine tests of the Triton kernels
    through the interpreter, where every layer launches the same kernels and each costs seconds per step."""
    from .draft_models import truncated_copy

    return truncated_copy(stories_path, tmp_path_factory.mktemp("stories") / "two-layer", num_layers=2)
