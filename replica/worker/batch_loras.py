"""The persistent batch's LoRA part: each row's adapter version, and a step's adapter slots.

    row r:  version[r]   the index of its adapter version here (0: the base model)

Two versions of one adapter name are two adapters to a step (``LoRARequest.version``); each gets its index once,
when a row first runs it. A step's adapters are put into device slots by the runner's ``LoRAManager`` (replica/lora/)
before the step's slot per request is read; a step with no adapter costs one array test.
"""

from __future__ import annotations

import numpy as np
from kvmesh.replica.lora.manager import LoRAManager
from kvmesh.replica.serving.lora_request import LoRARequest


class BatchLoRAs:
    def __init__(self) -> None:
        self.manager: LoRAManager | None = None  # the runner's LoRA state (None: LoRA off)
        self.version = np.zeros(0, np.int64)  # each row's adapter version: its index here (0: the base model)
        self.index: dict[tuple[str, str], int] = {}  # LoRARequest.version -> its index (> 0), once per version
        self.requests: dict[int, LoRARequest] = {}  # index -> the adapter version

    def fit(self, num_rows: int) -> None:
        """Rows up to ``num_rows`` (new rows run the base model)."""
        if num_rows > len(self.version):
            self.version = np.concatenate([self.version, np.zeros(num_rows - len(self.version), np.int64)])

    def set_row(self, row: int, lora: LoRARequest | None) -> None:
        self.version[row] = 0 if lora is None else self._index_of(lora)

    def slots(self, rows: np.ndarray) -> np.ndarray | None:
        """Each request's adapter slot [n] int32 (-1: base), its adapters put into slots first; None when no request
        of the step has an adapter."""
        if self.manager is None:
            return None
        ids = self.version[rows]
        if not ids.any():
            return None
        uniq = np.unique(ids[ids > 0]).tolist()
        table = np.full(int(ids.max()) + 1, -1, np.int32)
        table[uniq] = self.manager.activate([self.requests[i] for i in uniq])
        return table[ids]

    def _index_of(self, lora: LoRARequest) -> int:
        index = self.index.get(lora.version)
        if index is None:
            index = self.index[lora.version] = len(self.index) + 1
            self.requests[index] = lora
        return index
