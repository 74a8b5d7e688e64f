"""The profiling forward of KV sizing on a GPU: a full token budget of fresh prefills, no KV cache."""

from __future__ import annotations

import torch
from kvmesh.replica.attention.metadata import CommonAttentionMetadata
from kvmesh.replica.config import EngineConfig


def profile_forward(model: torch.nn.Module, attn_backend, config: EngineConfig, max_model_len: int, block_size: int,
                    device: torch.device) -> None:
    """A forward over ``max_num_batched_tokens`` of fresh prefills and the LM head of a full batch, every
    position in the null block, to measure peak memory."""
    budget = min(config.max_num_batched_tokens, config.max_num_seqs * max_model_len)
    lens = [min(max_model_len, budget - i) for i in range(0, budget, max_model_len)]
    cu = torch.tensor([0] + lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    # every position in the null block: a table as wide as the longest sequence (backends may index it)
    zeros = torch.zeros(len(lens), -(-max(lens) // block_size), dtype=torch.int32, device=device)
    common = CommonAttentionMetadata(
        num_reqs=len(lens), num_decodes=0, num_actual_tokens=budget, max_query_len=max(lens),
        max_seq_len=max(lens), block_size=block_size, query_start_loc=cu.to(device),
        seq_lens=torch.tensor(lens, dtype=torch.int32, device=device), block_tables=zeros,
        slot_mapping=torch.zeros(budget, dtype=torch.int64, device=device),
        query_start_loc_cpu=cu.tolist(), seq_lens_cpu=lens)
    positions = torch.cat([torch.arange(n) for n in lens]).to(device)
    hidden = model(torch.zeros(budget, dtype=torch.int64, device=device), positions, attn_backend.build(common))
    rows = min(config.max_num_seqs, budget)
    model.compute_logits(hidden[:rows])
    if device.type == "cuda":
        torch.cuda.synchronize(device)
