"""What the input batch hands the runner for one step (input_batch.py builds it), and the one upload it rides in."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from kvmesh.replica.attention.metadata import CommonAttentionMetadata
from kvmesh.replica.lora.ops import LoRAMapping
from kvmesh.replica.utils.cpu_gpu_buffer import PackedUpload


@dataclass(slots=True)
class ModelInputs:
    input_ids: torch.Tensor
    """[T] int64."""
    positions: torch.Tensor
    """[T] int64."""
    common: CommonAttentionMetadata
    """Attention description of the step."""
    logits_indices: torch.Tensor | None
    """[N] int64 rows of the hidden states whose logits are sampled (None for a step staged for a graph)."""
    sample_rows: np.ndarray
    """[N] persistent-batch rows of the requests that sample, in logits order."""
    sample_request_ids: list[str]
    """Their request ids."""
    rows: np.ndarray
    """[n] persistent-batch rows of every request of the step, in order (``common.query_start_loc_cpu[i]``
    is the first token of row ``rows[i]``)."""
    static_size: int | None = None
    """The capture size the step's inputs were staged at in the decode graphs' inputs (None: not staged there;
    then ``logits_indices`` and ``common.query_start_loc`` are None)."""
    graph_sampling: str | None = None
    """The decode graph a staged step replays: None the greedy one, else fixed_sampler.py's variant (RANDOM,
    TOP_K_TOP_P) drawing with the settings staged beside its inputs."""
    prefill_size: int | None = None
    """The query length a one-request prefill step was staged at in the prefill graphs' inputs
    (prefill_graph.py; None: not staged there). ``graph_sampling`` and ``graph_answers`` apply as for a
    decode graph."""
    graph_answers: bool = False
    """The replay's tokens are the step's; else the eager sampler runs on its logits (logit_bias, min_tokens
    bans)."""
    lora_mapping: LoRAMapping | None = None
    """Which adapter slot each request of the step uses (None: no adapter in the step; such a step is eager)."""


def step_upload(max_num_tokens: int, max_num_reqs: int, max_blocks_per_req: int,
                device: torch.device) -> PackedUpload:
    """The one upload of a step's inputs, sized for the largest step the runner plans for:

        [ input_ids | positions | slot_mapping | logits_indices | query_start_loc | seq_lens | block_tables
          | gather indices (async scheduling) | LoRA slot per request ]     int64 ids, positions, slots and
                                                                        indices; int32 the rest"""
    nbytes = 8 * (3 * max_num_tokens + 3 * max_num_reqs) + 4 * (max_num_reqs * (max_blocks_per_req + 3) + 1)
    return PackedUpload(nbytes, device)
