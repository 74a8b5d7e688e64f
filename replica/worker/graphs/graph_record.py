"""Recording one CUDA graph into a shared memory pool: the decode graphs (cuda_graph.py) and the short-prefill
graphs (prefill_graph.py) are all recorded this way, into one pool."""

from __future__ import annotations

from collections.abc import Callable

import torch


def record_graph(forward: Callable[[], tuple], device: torch.device, pool) -> tuple[torch.cuda.CUDAGraph, tuple]:
    """Run ``forward`` once outside the capture (lazy inits, kernel compiles and allocator growth happen there),
    then record it into ``pool`` (None: a new one; ``graph.pool()`` is the pool to pass next).
    Returns the graph and the outputs its replays write."""
    forward()
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        outputs = forward()
    return graph, outputs
