"""The copies between the device cache and the host tier that one engine step asks of the runner.

The KV cache manager decides them while it schedules (kvcache/offload.py); the model runner
performs them around the step's forward pass::

    loads  (host -> device)   before the forward: the prefix the step's prefill reads
    forward                   writes the step's new K/V
    stores (device -> host)   after the forward: the blocks the step completed, copied down

Only ids cross; no tensors (the policy layer stays free of torch).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class OffloadCopies:
    """One step's copies, by block id."""

    job_id: int
    """Names this step's stores (vLLM's offloading job id); the runner reports it back once they landed
    (``finished_offload_stores``)."""
    loads: list[tuple[int, int]] = field(default_factory=list)
    """``(host_block_id, device_block_id)``: load-backs, done before the step's forward pass."""
    stores: list[tuple[int, int]] = field(default_factory=list)
    """``(device_block_id, host_block_id)``: copies down, issued after the step's forward pass."""
