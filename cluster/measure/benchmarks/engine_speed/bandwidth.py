"""The weight-read floor of a decode step: bytes of weights / memory bandwidth.

Every decode step reads every weight once, so no step can be faster than that. The bandwidth is
measured, not looked up: a large device-to-device copy (``dst.copy_(src)``), counting the bytes
read plus the bytes written -- HBM on a GPU, DRAM (memcpy) on a CPU.
"""

from __future__ import annotations

import torch
from kvmesh.cluster.measure.benchmarks.engine_speed.timing import Clock

COPY_BYTES = {"cuda": 1 << 30, "cpu": 128 << 20}
"""Size of the copied buffer per device type (large enough to leave every cache)."""
COPY_REPEATS = 10


def copy_bandwidth(device: torch.device) -> dict:
    """Bytes/s of a device-to-device copy (read + write counted)."""
    nbytes = COPY_BYTES.get(device.type, COPY_BYTES["cpu"])
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)  # [nbytes]
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm: pages touched, kernels loaded
    clock = Clock(device)
    for _ in range(COPY_REPEATS):
        dst.copy_(src)
    seconds = clock.read()["wall_s"]
    del src, dst
    return {"bytes_per_s": 2 * nbytes * COPY_REPEATS / seconds, "copy_bytes": nbytes, "repeats": COPY_REPEATS,
            "method": f"{device.type} device-to-device copy of {nbytes >> 20} MiB x {COPY_REPEATS}, "
                      "read + write bytes counted"}


def model_weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the parameters as the engine holds them (its dtype, this rank's shard)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def weight_read_floor(weight_bytes: int, device: torch.device) -> dict:
    bandwidth = copy_bandwidth(device)
    return {"weight_bytes": weight_bytes, "bandwidth": bandwidth,
            "floor_ms_per_decode_step": 1000 * weight_bytes / bandwidth["bytes_per_s"]}
