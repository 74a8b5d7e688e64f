"""LoRA pieces without an engine: the Triton kernels against the torch path (under Triton's interpreter on CPU),
TP sharding of adapter factors like the layers they adapt, the slots' LRU, and what a PEFT directory may hold."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from kvmesh.replica.distributed.parallel_state import ParallelState  # noqa: E402
from kvmesh.replica.layers.linear import (  # noqa: E402
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from kvmesh.replica.lora.layers import LoRALinear, LoRAStepState  # noqa: E402
from kvmesh.replica.lora.ops import lora_update_torch  # noqa: E402
from kvmesh.replica.lora.peft_config import LoRAError, read_peft_config  # noqa: E402
from kvmesh.replica.lora.slots import LoRASlots  # noqa: E402
from kvmesh.replica.triton_utils import triton_problem  # noqa: E402

GEN = torch.Generator().manual_seed(0)


def rand(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=GEN).to(dtype)


def groups(req_slots: list[int], query_lens: list[int]) -> list[tuple[int, torch.Tensor]]:
    token_slots = np.repeat(req_slots, query_lens)
    return [(s, torch.from_numpy(np.flatnonzero(token_slots == s))) for s in sorted(set(req_slots) - {-1})]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_segment_gemm_equals_the_torch_path(dtype):
    problem = triton_problem(torch.device("cpu"))
    if problem is not None:
        pytest.skip(problem)
    from kvmesh.replica.lora.triton_lora import lora_update_triton

    slots, rank, d_in, d_out = 3, 24, 80, 136  # none a multiple of the kernel's tiles
    a, b = rand(slots, rank, d_in, dtype=dtype), rand(slots, d_out, rank, dtype=dtype)
    req_slots, query_lens = [1, -1, 0, 2, 1], [1, 3, 19, 1, 5]  # decodes and prefills; a base request between
    x = rand(sum(query_lens), d_in, dtype=dtype)
    y0 = rand(sum(query_lens), d_out, dtype=dtype)
    want = y0.float().clone()
    for slot, tokens in groups(req_slots, query_lens):  # fp32 math; the shrink's output read in B's dtype, as vLLM
        buf = (x.float()[tokens] @ a.float()[slot].T).to(dtype).float()
        want.index_add_(0, tokens, buf @ b.float()[slot].T)
    got = y0.clone()
    qsl = torch.tensor(np.concatenate([[0], np.cumsum(query_lens)]), dtype=torch.int32)
    lora_update_triton(got, x, a, b, qsl, torch.tensor(req_slots, dtype=torch.int32), len(req_slots),
                       max(query_lens))
    # bf16: y is stored in bf16 and the shrink's output is read in bf16 (the GPU rounds it, Triton's interpreter
    # truncates), so near-zero outputs differ by a few tenths; a wrong slot or segment differs by tens
    atol, rtol = (1e-4, 1e-4) if dtype == torch.float32 else (0.5, 0.1)
    torch.testing.assert_close(got.float(), want, atol=atol, rtol=rtol)
    assert torch.equal(got[1:4], y0[1:4])  # the base request's rows are untouched


def lora_out(layer: LoRALinear, x: torch.Tensor, slot: int) -> torch.Tensor:
    y = torch.zeros(x.shape[0], layer.lora_b.shape[1])
    lora_update_torch(y, x, layer.lora_a, layer.lora_b, [(slot, torch.arange(x.shape[0]))])
    return y


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])  # 1 < TP: the K/V head is replicated on both ranks
def test_qkv_factors_shard_by_output_like_the_layer(num_kv_heads):
    hidden, dh, nh, r, tp = 16, 4, 4, 3, 2
    factors = {s: (rand(r, hidden), rand(n * dh, r)) for s, n in (("q", nh), ("k", num_kv_heads), ("v", num_kv_heads))}
    x = rand(5, hidden)
    full = {s: x @ a.T @ b.T for s, (a, b) in factors.items()}
    q_parts = []
    for rank in range(tp):
        base = QKVParallelLinear(hidden, dh, nh, num_kv_heads, parallel=ParallelState(rank, tp))
        layer = LoRALinear(base, ["q", "k", "v"], max_loras=2, max_rank=4, state=LoRAStepState())
        layer.set_slot(1, factors)
        q, k, v = lora_out(layer, x, 1).split([base.num_heads * dh, base.num_kv_heads * dh,
                                                base.num_kv_heads * dh], -1)
        q_parts.append(q)
        start = base.kv_head_start * dh
        torch.testing.assert_close(k, full["k"][:, start:start + base.num_kv_heads * dh])
        torch.testing.assert_close(v, full["v"][:, start:start + base.num_kv_heads * dh])
        assert not lora_out(layer, x, 0).any()  # the other slot holds nothing
    torch.testing.assert_close(torch.cat(q_parts, -1), full["q"])


def test_gate_up_shards_by_output_and_down_by_input():
    hidden, inter, r, tp = 8, 12, 2, 2
    gate, up, down = (rand(r, hidden), rand(inter, r)), (rand(r, hidden), rand(inter, r)), (rand(r, inter),
                                                                                          rand(hidden, r))
    x, h = rand(3, hidden), rand(3, inter)
    gate_up_parts, down_sum = [], torch.zeros(3, hidden)
    for rank in range(tp):
        ps = ParallelState(rank, tp)
        merged = LoRALinear(MergedColumnParallelLinear(hidden, [inter, inter], parallel=ps), [0, 1], 1, 4,
                            LoRAStepState())
        merged.set_slot(0, {0: gate, 1: up})
        gate_up_parts.append(lora_out(merged, x, 0).view(3, 2, inter // tp))
        row = LoRALinear(RowParallelLinear(inter, hidden, parallel=ps), [None], 1, 4, LoRAStepState())
        row.set_slot(0, {None: down})
        down_sum += lora_out(row, h[:, rank * inter // tp:(rank + 1) * inter // tp], 0)  # the all-reduce's sum
    gate_up = torch.cat(gate_up_parts, -1)
    torch.testing.assert_close(gate_up[:, 0], x @ gate[0].T @ gate[1].T)
    torch.testing.assert_close(gate_up[:, 1], x @ up[0].T @ up[1].T)
    torch.testing.assert_close(down_sum, h @ down[0].T @ down[1].T)


def test_slots_keep_the_step_and_give_up_the_least_recently_used():
    slots = LoRASlots(2)
    assert slots.assign(["a", "b"]) == ({"a": 0, "b": 1}, [("a", 0), ("b", 1)])
    assert slots.assign(["b"]) == ({"b": 1}, [])
    assert slots.assign(["c", "b"]) == ({"c": 0, "b": 1}, [("c", 0)])  # a was least recently used
    assert slots.release("b") == 1 and slots.resident == ["c"]
    with pytest.raises(ValueError, match="max_loras"):
        slots.assign(["x", "y", "z"])


def write_adapter(path, **config):
    path.mkdir()
    (path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8, "lora_alpha": 16,
                                                          "target_modules": ["q_proj"], **config}))
    (path / "adapter_model.safetensors").write_bytes(b"")
    return str(path)


@pytest.mark.parametrize("config, match", [
    ({"r": 32}, "rank 32, above max_lora_rank=16"),
    ({"use_dora": True}, "DoRA"),
    ({"bias": "all"}, "bias='none'"),
    ({"lora_bias": True}, "LoRA biases"),
    ({"target_modules": ["q_proj", "lm_head"]}, r"targets \['lm_head'\]"),
    ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
    ({"peft_type": "IA3"}, "LORA only"),
])
def test_what_kvmesh_does_not_serve_is_refused_by_name(tmp_path, config, match):
    with pytest.raises(LoRAError, match=match):
        read_peft_config(write_adapter(tmp_path / "a", **config), max_lora_rank=16)


def test_a_directory_without_the_peft_files_is_refused(tmp_path):
    with pytest.raises(LoRAError, match="not a directory"):
        read_peft_config(str(tmp_path / "missing"), 16)
    (tmp_path / "empty").mkdir()
    with pytest.raises(LoRAError, match="has no adapter_config.json"):
        read_peft_config(str(tmp_path / "empty"), 16)
    assert read_peft_config(write_adapter(tmp_path / "ok", use_rslora=True), 16).scale == 16 / 8**0.5
