"""What passive health knows about one replica (``ReplicaHealth``); the bookkeeping is router/routing/outlier.py."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class ReplicaHealth:
    """What passive health knows about one replica."""

    consecutive_failures: int = 0
    """Failures since its last answer that arrived."""
    last_failure: str | None = None
    """What its last failure was, for people (``/replicas``, logs)."""
    ejections: int = 0
    """Times it was ejected (a total, for ``/replicas`` and metrics)."""
    level: int = 0
    """Ejections that count towards the next one's length (``base * 2^level``)."""
    ejected_until: float | None = None
    """Monotonic time its current ejection ends; None: in rotation. Past it, it waits for its probe request."""
    readmitted_at: float = 0.0
    """Monotonic time it last came back into rotation."""
    last_progress: float = 0.0
    """Monotonic time of its last sign of progress (bytes of an answer, its /load or KV events moving)."""
