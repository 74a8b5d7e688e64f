"""The checkout's sibling ``shared/`` folder (real models and traces for benchmarks and workloads), found once.

``$KVMESH_SHARED_DIR`` when set, else ``../shared`` beside the repository. Nothing is copied from it
and nothing requires it: callers check that the file they want is there.
"""

from __future__ import annotations

import os
from pathlib import Path


def shared_path(*parts: str) -> Path:
    """``$KVMESH_SHARED_DIR/PARTS...`` (default: the checkout's sibling ``shared/``)."""
    root = os.environ.get("KVMESH_SHARED_DIR")
    return Path(root or Path(__file__).resolve().parents[3] / "shared").joinpath(*parts)


def stories_model() -> Path:
    """The real tiny Llama (stories260K) as a Hugging Face directory."""
    return shared_path("models", "stories260K", "hf")
