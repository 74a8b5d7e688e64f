"""What a real decode step launches, every Triton and aten kernel, by phase (decode_step_launches.py).

The engine's own step on stories260K (cut to 2 layers here: each layer's launches are counted, and each
costs the interpreter) with the Triton attention backend and the fused layers (the CUDA path, run through
Triton's interpreter here). The counts do not depend on the batch (256 gives the same, in BENCHMARKS.md; it
takes minutes in the interpreter), so the test steps small batches.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from kvmesh.replica.triton_utils import triton_problem

from .decode_step_launches import decode_step_launches

pytestmark = pytest.mark.skipif(triton_problem(torch.device("cpu")) is not None and not torch.cuda.is_available(),
                                reason=str(triton_problem(torch.device("cpu"))))

LAYER = Counter({"matmul": 4, "triton:_rms_norm_kernel": 2, "triton:_unified_attention_kernel": 1,
                 "triton:_silu_and_mul_kernel": 1})
"""A decoder layer's decode launches: qkv, o, gate_up and down GEMMs, two (add +) RMSNorms, attention (which
rotates q and k, writes the new K/V into the cache and merges its split-KV parts itself), SiLU-and-mul."""


@pytest.fixture(scope="module")
def step_launches(two_layer_stories):
    """``step_launches(batch, sms)``: a decode step's launches, split-KV sized for ``sms`` SMs, each watched once
    for the module (the interpreter runs every program of the grid, ~batch x 4 KV heads x splits per layer)."""
    from kvmesh.replica.attention import triton_paged_attention as tpa

    seen = {}

    def launches(batch: int, sms: int):
        if (batch, sms) not in seen:
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(tpa, "num_sms", lambda device: sms)
                seen[batch, sms] = decode_step_launches(str(two_layer_stories), batch)
        return seen[batch, sms]

    return launches


@pytest.mark.parametrize("batch,sms", [(1, 0), (1, 132), (4, 32)])
def test_every_decoder_layer_launches_eight_kernels_and_nothing_else(step_launches, batch, sms):
    """sms=132: split-KV sized for an H100 as on the GPU (a batch-1 step's context cut into 32 parts), so the
    CPU count covers the GPU's kernel set. Batch 4 splits too (2 parts at 32 SMs): several rows of a split
    step launch what one row does (at 132 SMs it would split 16 ways, the same launches over 8x the programs)."""
    launches = step_launches(batch, sms)
    assert [dict(layer) for layer in launches.per_layer] == [dict(LAYER)] * len(launches.per_layer)
    assert sum(LAYER.values()) == 8


def test_outside_the_layers_a_decode_step_launches_embedding_final_norm_lm_head_and_sampling(step_launches):
    launches = step_launches(1, 0)  # off CUDA num_sms is 0: the step the test above watched unsplit
    phases = {phase: dict(counts) for phase, counts in launches.phases.items() if phase != "layer"}
    assert phases["model"] == {"aten::embedding": 1, "triton:_rms_norm_kernel": 1}
    assert phases["lm_head"] == {"matmul": 1}
    assert sum(phases.get("sample", {}).values()) <= 2, phases  # the logits cast (+ argmax on CUDA)
    assert not phases.get("inputs") and not phases.get("runner") and not phases.get("output"), phases
