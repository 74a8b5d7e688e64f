"""Which path a step runs (vLLM's ``CudagraphDispatcher``): a decode graph, a one-request prefill graph, or eager.

Chosen once per step, from the step's shape (``BatchDescriptor``), before its inputs are staged:

    decode graph    every row decodes one token and samples, and a capture size holds the rows   (cuda_graph.py)
    prefill graph   one request that samples, its query no longer than a prefill capture size    (prefill_graph.py)
    eager           any other step, a step that may not use the graphs (prompt logprobs need the hidden
                    states), or a runner without graphs

The batch builder (input_batch.py) then stages the step's inputs where its path reads them: into the decode
or prefill graphs' own inputs (static_inputs.py, ``PrefillInputs``), or the eager step's one upload.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvmesh.replica.worker.graphs.cuda_graph import StaticDecode


@dataclass(frozen=True, slots=True)
class BatchDescriptor:
    """A step's shape, as far as the choice of its path goes."""

    num_reqs: int
    """Rows of the step."""
    num_tokens: int
    """Tokens the step computes (= ``num_reqs`` when every row decodes one)."""
    num_sampled: int
    """Rows that sample a token this step."""


@dataclass(frozen=True, slots=True)
class StepPath:
    """The path of one step: at most one of the two capture sizes is set; neither: eager."""

    decode_size: int | None = None
    """The decode graphs' capture size the step's rows are padded to (cuda_graph.py)."""
    prefill_size: int | None = None
    """The prefill graphs' capture size the step's query is padded to (prefill_graph.py)."""


EAGER = StepPath()
"""The eager path: the step's tensors uploaded at their own shapes, the forward run op by op."""


class CudagraphDispatcher:
    """Picks each step's path from the runner's graphs (``StaticDecode`` and its ``prefill``; None: eager only)."""

    def __init__(self, static: StaticDecode | None = None) -> None:
        self.static = static

    def dispatch(self, batch: BatchDescriptor, use_graphs: bool = True) -> StepPath:
        """The path of a step of shape ``batch`` (``use_graphs`` False: eager, whatever the shape)."""
        static = self.static
        if static is None or not use_graphs:
            return EAGER
        n = batch.num_reqs
        if batch.num_tokens == n and batch.num_sampled == n:  # decode-only, every row samples
            size = static.size_for(n)
            if size is not None:
                return StepPath(decode_size=size)
        prefill = static.prefill
        if prefill is not None and n == 1 and batch.num_sampled == 1:  # one request, a short query
            size = prefill.size_for(batch.num_tokens)
            if size is not None:
                return StepPath(prefill_size=size)
        return EAGER
