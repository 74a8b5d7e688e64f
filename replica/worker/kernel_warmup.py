"""Every Triton kernel specialization a served step can hit, compiled when the runner starts (not on first use).

Triton compiles a kernel once per *specialization*: its constexprs, its tensors' dtypes and, unless a
kernel opts out, whether each int argument is 1 or a multiple of 16 and each pointer 16-byte aligned.
The attention kernels opt out for what varies step to step (the request count, the block table's
width, the index arrays' offsets in the step's packed upload: ``do_not_specialize``), so what is left
is a short list of step shapes:

    decode-only steps     one per split count a batch of 1..max_num_seqs rows takes (split-KV from the
                          SM count); the tile is the 16-row one and rotary + the K/V write are inside
    other steps           each tile (runs of at most 16 // G query tokens: 16 rows; longer: 64 rows) x
                          every split count such a step can take (1, 2, 4, ... while its programs leave
                          SMs idle)

Each shape runs through the model once over the null block (block 0: every slot and block-table entry
is 0, the cache's scratch row that padding rows use too), with its split count set in the metadata, so
the fused layers and the LM-head-free forward compile exactly what a served step of that shape will
launch. The capture of the decode graphs (cuda_graph.py) then finds them compiled too. Shown as a
progress bar, like the repo's other long work; skipped off CUDA (nothing compiles in the interpreter)
and for attention backends other than triton.
"""

from __future__ import annotations

import logging
import time
from typing import NamedTuple

import torch
from kvmesh.replica.attention.metadata import CommonAttentionMetadata

logger = logging.getLogger(__name__)


class StepShape(NamedTuple):
    num_reqs: int
    query_len: int
    """Query tokens of every request (1: a decode-only step)."""
    num_splits: int
    """Split-KV parts, as the backend would choose for a served step of this shape."""


def step_shapes(max_num_seqs: int, max_num_batched_tokens: int, queries_per_kv: int, num_kv_heads: int,
                device: torch.device) -> list[StepShape]:
    """One step per kernel specialization the scheduler's steps can reach on ``device``."""
    from kvmesh.replica.attention.triton_paged_attention import (  # triton: imported where it runs
        MIN_BLOCK_M,
        decode_programs,
        num_kv_splits,
        tile_shape,
    )

    shapes, seen = [], set()
    for rows in range(1, max_num_seqs + 1):  # decode-only: the split count is all that varies
        splits = num_kv_splits(decode_programs(rows, num_kv_heads), device)
        if splits not in seen:
            seen.add(splits)
            shapes.append(StepShape(rows, 1, splits))
    most = num_kv_splits(num_kv_heads, device)  # a one-block step over a long context splits the most
    tiles = {}
    for query_len in (2, MIN_BLOCK_M // queries_per_kv + 1):  # the shortest run of each tile
        block_m = tile_shape(queries_per_kv, query_len)[1]
        if query_len <= max_num_batched_tokens:
            tiles.setdefault(block_m, query_len)
    for query_len in tiles.values():
        splits = 1
        while splits <= most:
            shapes.append(StepShape(1, query_len, splits))
            splits *= 2
    return shapes


@torch.inference_mode()
def warm_up_kernels(runner, show_progress: bool = True) -> int:
    """Run every ``step_shapes`` step through ``runner``'s model (a ``ModelRunner`` with its KV cache), so
    serving compiles nothing; returns how many steps ran (0 where skipped)."""
    backend = runner.attn_backend
    if runner.device.type != "cuda" or backend.name != "triton":
        return 0
    return run_step_shapes(runner, show_progress)


def run_step_shapes(runner, show_progress: bool = True) -> int:
    """The warm-up itself, on any device the backend runs on (tests drive it through the interpreter)."""
    from tqdm import tqdm

    attn = runner.model.attention_layers()[0]
    groups = attn.num_heads // attn.num_kv_heads
    shapes = step_shapes(runner.config.max_num_seqs, runner.config.max_num_batched_tokens, groups,
                         attn.num_kv_heads, runner.device)
    width = runner.input_batch.block_tables.table.shape[1]
    start = time.perf_counter()
    for shape in tqdm(shapes, desc="compiling kernels", unit="shape", disable=not show_progress):
        run_shape(runner, shape, width)
    if runner.device.type == "cuda":
        torch.cuda.synchronize(runner.device)
    logger.info("compiled the kernels of %d step shapes in %.1f s", len(shapes), time.perf_counter() - start)
    return len(shapes)


def run_shape(runner, shape: StepShape, width: int) -> None:
    """One forward of ``shape`` over the null block (block tables ``width`` wide, as the runner's)."""
    device, (reqs, query_len, splits) = runner.device, shape
    tokens = reqs * query_len
    cu = list(range(0, tokens + 1, query_len))
    common = CommonAttentionMetadata(
        num_reqs=reqs, num_decodes=reqs if query_len == 1 else 0, num_actual_tokens=tokens,
        max_query_len=query_len, max_seq_len=query_len, block_size=runner.block_size,
        query_start_loc=torch.tensor(cu, dtype=torch.int32, device=device),
        seq_lens=torch.full((reqs,), query_len, dtype=torch.int32, device=device),
        block_tables=torch.zeros(reqs, width, dtype=torch.int32, device=device),
        slot_mapping=torch.zeros(tokens, dtype=torch.int64, device=device), query_start_loc_cpu=cu,
        seq_lens_cpu=[query_len] * reqs)
    metadata = runner.attn_backend.build(common)
    metadata.num_splits = splits
    zeros = torch.zeros(tokens, dtype=torch.int64, device=device)
    runner.model(zeros, zeros, metadata)  # token 0 at position 0, written to and read from slot 0
