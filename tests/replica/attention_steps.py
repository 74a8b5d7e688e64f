"""One attention step built from ``(num_computed, num_new)`` per request, for backend tests.

Requests come decodes first; their blocks are handed out in random order and every slot of the
cache starts with stale random values, so a backend that reads a wrong slot shows it.
"""

from __future__ import annotations

import torch
from kvmesh.replica.attention.metadata import CommonAttentionMetadata

CPU = torch.device("cpu")


def make_step(specs, block_size, num_blocks=None, seed=0, hq=4, hk=2, dh=8, device=CPU, dtype=torch.float32):
    """specs [(num_computed, num_new)] -> (q, k, v, logical cache [2, num_blocks, bs, Hk, Dh], common);
    ``num_blocks`` None: just enough for the step (plus the null block and one spare)."""
    gen = torch.Generator().manual_seed(seed)
    if num_blocks is None:
        num_blocks = 2 + sum(-(-(c + n) // block_size) for c, n in specs)
    cache = torch.randn(2, num_blocks, block_size, hk, dh, generator=gen)  # stale contents everywhere
    free = torch.randperm(num_blocks - 1, generator=gen).add(1).tolist()
    tables, slots, qsl, seq_lens = [], [], [0], []
    for computed, new in specs:
        n = computed + new
        table = [free.pop() for _ in range(-(-n // block_size))]
        tables.append(table)
        slots += [table[p // block_size] * block_size + p % block_size for p in range(computed, n)]
        qsl.append(qsl[-1] + new)
        seq_lens.append(n)
    width = max(map(len, tables))
    common = CommonAttentionMetadata(
        num_reqs=len(specs), num_decodes=sum(new == 1 for _, new in specs), num_actual_tokens=qsl[-1],
        max_query_len=max(new for _, new in specs), max_seq_len=max(seq_lens), block_size=block_size,
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32, device=device),
        slot_mapping=torch.tensor(slots, device=device), query_start_loc_cpu=qsl, seq_lens_cpu=seq_lens)
    q, k, v = (torch.randn(qsl[-1], h, dh, generator=gen) for h in (hq, hk, hk))
    return *(x.to(device, dtype) for x in (q, k, v, cache)), common
