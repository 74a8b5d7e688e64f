"""Wall and process-CPU time of a piece of work; on CUDA the device is synchronized at both ends."""

from __future__ import annotations

import time

import torch


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Clock:
    """Started on construction (after a device sync); ``read()`` syncs again and returns seconds."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        synchronize(device)
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def read(self) -> dict[str, float]:
        synchronize(self.device)
        return {"wall_s": time.perf_counter() - self.wall, "cpu_s": time.process_time() - self.cpu}
