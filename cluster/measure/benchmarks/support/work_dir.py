"""Where a live benchmark's processes keep their logs (``--work``), and how its results file is written."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path


def in_work_dir(work: str | None, prefix: str, run: Callable[[Path], dict]) -> dict:
    """``run(folder)`` in ``work`` (made if missing, kept after) or, when None, in a temporary folder removed after."""
    if work is not None:
        Path(work).mkdir(parents=True, exist_ok=True)
        return run(Path(work))
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        return run(Path(tmp))


def write_results(result: dict, out: str, command: str) -> Path:
    """``result`` with the ``command`` that made it, as JSON at ``out`` (its folder made); the file's path."""
    result["command"] = command
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    return path
