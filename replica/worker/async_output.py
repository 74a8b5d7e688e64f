"""A launched step's result (vLLM's ``AsyncModelRunnerOutput``): the sampled ids are on their way to the host.

``ModelRunner.execute_model_async`` enqueues a step's forward, sampling and the one device-to-host copy
of its sampled ids (plus one of its logprobs, one of its prompt logprobs, when asked), and returns this at
once; ``get()`` waits for the copies and returns what ``execute_model`` returns (``{request_id: token}``,
a ``ModelRunnerOutput`` when logprobs were asked).
The engine's async scheduling calls ``get()`` for step N after it has launched step N+1.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
from kvmesh.replica.step.outputs import ModelRunnerOutput

if TYPE_CHECKING:
    from kvmesh.replica.sample.logprobs import LogprobsTensors
    from kvmesh.replica.sample.prompt_logprobs import PendingPromptLogprobs
    from kvmesh.replica.utils.cpu_gpu_buffer import HostCopies
    from kvmesh.replica.worker.input_batch import InputBatch


class AsyncModelRunnerOutput:
    def __init__(self, input_batch: InputBatch, request_ids: list[str], rows: np.ndarray, tokens: torch.Tensor,
                 copies: HostCopies, logprobs: LogprobsTensors | None = None,
                 prompt_logprobs: PendingPromptLogprobs | None = None, tokens_in_logprobs: bool = False,
                 draft_targets: dict[str, list[int]] | None = None) -> None:
        self.input_batch, self.request_ids, self.rows, self.tokens = input_batch, request_ids, rows, tokens
        self.draft_targets = draft_targets  # the target's argmax at draft positions (spec_decode/verify.py)
        self.logprobs, self.prompt_logprobs = logprobs, prompt_logprobs
        # [N] the step's one device-to-host transfer; or the ids are column 0 of the logprobs' (a decode graph's)
        self.host, self.event = (None, None) if tokens_in_logprobs else copies.start(tokens)
        self.params = [input_batch.params[row] for row in rows.tolist()] if logprobs is not None else None

    @classmethod
    def ready(cls, value: dict) -> AsyncModelRunnerOutput:
        """A step that sampled nothing: its result is known at launch."""
        out = cls.__new__(cls)
        out._value = value
        return out

    @classmethod
    def prompt_logprobs_only(cls, pending: PendingPromptLogprobs) -> AsyncModelRunnerOutput:
        """A step that sampled nothing but computed prompt logprobs: read when ``get()`` is called."""
        out = cls.__new__(cls)
        out._pending = pending
        return out

    def get(self) -> dict[str, int]:
        if hasattr(self, "_value"):
            return self._value
        if hasattr(self, "_pending"):
            self._value = ModelRunnerOutput({}, None, self._pending.resolve())
            return self._value
        if self.event is not None:
            self.event.synchronize()
        host = self.logprobs.token_ids[:, 0] if self.host is None else self.host  # [N] (waits for its copy)
        self.input_batch.record_samples(self.rows, host.numpy(), self.tokens)
        sampled = dict(zip(self.request_ids, host.tolist(), strict=True))
        self._value = sampled
        if self.logprobs is None and self.prompt_logprobs is None and self.draft_targets is None:
            return sampled
        token_logprobs = None
        if self.logprobs is not None:  # row i of the logits is the step's i-th sampling request
            token_logprobs = {rid: self.logprobs.row(i, sp.logprobs) for i, (rid, sp) in
                              enumerate(zip(self.request_ids, self.params, strict=True)) if sp.logprobs is not None}
        prompt_logprobs = None if self.prompt_logprobs is None else self.prompt_logprobs.resolve()
        self._value = ModelRunnerOutput(sampled, token_logprobs, prompt_logprobs, self.draft_targets)
        return self._value
