"""Each fused Triton kernel equals its layer's plain-torch reference (``forward_native``).

Shapes are ragged on purpose: token counts that are not powers of two, hidden sizes and head
counts that leave masked lanes, head_dim 8/64/128, q and k head counts that differ, positions
up to the table's last row. Kernels run on the GPU when there is one, else on CPU through Triton's
interpreter (tests/replica/conftest.py).
"""

from __future__ import annotations

import pytest
import torch
from kvmesh.replica.layers.activation import SiluAndMul
from kvmesh.replica.layers.custom_op import force_triton
from kvmesh.replica.layers.layernorm import RMSNorm
from kvmesh.replica.layers.rotary import RotaryEmbedding
from torch.utils._python_dispatch import TorchDispatchMode

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# fp32: reduction order only. bf16/fp16: the interpreter rounds bf16 toward zero (a GPU to nearest),
# so an intermediate rounding may differ by one unit in the last place.
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=3e-2, rtol=2e-2),
       torch.float16: dict(atol=4e-3, rtol=2e-3)}


def randn(*shape, dtype, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(dtype=dtype, device=device)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens,hidden", [(1, 8), (13, 64), (5, 200)])
def test_fused_add_rms_norm_equals_reference(triton_device, dtype, num_tokens, hidden):
    norm = RMSNorm(hidden, eps=1e-5).to(triton_device, dtype)
    norm.weight.copy_(randn(hidden, dtype=dtype, device=triton_device, seed=1) * 0.5 + 1)
    x = randn(num_tokens, hidden, dtype=dtype, device=triton_device, seed=2) * 3
    residual = randn(num_tokens, hidden, dtype=dtype, device=triton_device, seed=3)
    out, new_residual = norm.forward_triton(x, residual)
    ref_out, ref_residual = norm.forward_native(x, residual)
    assert out.dtype == dtype and new_residual.dtype == dtype
    torch.testing.assert_close(new_residual, ref_residual, **TOL[dtype])
    torch.testing.assert_close(out, ref_out, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_without_residual_equals_reference(triton_device, dtype):
    norm = RMSNorm(96, eps=1e-6).to(triton_device, dtype)
    norm.weight.copy_(randn(96, dtype=dtype, device=triton_device, seed=1))
    x = randn(7, 96, dtype=dtype, device=triton_device, seed=2)
    torch.testing.assert_close(norm.forward_triton(x), norm.forward_native(x), **TOL[dtype])


def rotary_on(device, dtype, head_dim, max_position):
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # the model is built under its dtype: the table is in it too
    try:
        with torch.device(device):
            return RotaryEmbedding(head_dim, max_position, theta=10000.0)
    finally:
        torch.set_default_dtype(default)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens,num_heads,num_kv_heads,head_dim", [
    (1, 2, 1, 8), (9, 6, 2, 64), (5, 4, 4, 128), (3, 3, 1, 64)])
def test_rotary_in_place_on_qkv_views_equals_reference(triton_device, dtype, num_tokens, num_heads,
                                                        num_kv_heads, head_dim):
    """q and k are strided views of one qkv row, as the model passes them; v must stay untouched."""
    max_position = 300
    rotary = rotary_on(triton_device, dtype, head_dim, max_position)
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    qkv = randn(num_tokens, q_size + 2 * kv_size, dtype=dtype, device=triton_device)  # [T, (Hq + 2 Hk) * D]
    q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
    q, k = q.view(-1, num_heads, head_dim), k.view(-1, num_kv_heads, head_dim)
    positions = torch.randint(0, max_position, (num_tokens,), generator=torch.Generator().manual_seed(4))
    positions[0] = max_position - 1
    positions = positions.to(triton_device)
    ref_q, ref_k = rotary.forward_native(positions, q, k)
    v_before = v.clone()
    out_q, out_k = rotary.forward_triton(positions, q, k)
    assert out_q.data_ptr() == qkv.data_ptr() and out_k.data_ptr() == k.data_ptr()  # in place
    torch.testing.assert_close(q, ref_q, **TOL[dtype])
    torch.testing.assert_close(k, ref_k, **TOL[dtype])
    assert torch.equal(v, v_before)


def test_rotary_at_position_zero_is_the_identity(triton_device):
    rotary = rotary_on(triton_device, torch.float32, 8, 16)
    q = randn(2, 3, 8, dtype=torch.float32, device=triton_device)
    k = randn(2, 1, 8, dtype=torch.float32, device=triton_device, seed=1)
    q0, k0 = q.clone(), k.clone()
    rotary.forward_triton(torch.zeros(2, dtype=torch.int64, device=triton_device), q, k)
    torch.testing.assert_close(q, q0, atol=0, rtol=0)
    torch.testing.assert_close(k, k0, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens,intermediate", [(1, 1), (6, 172), (3, 1100)])
def test_silu_and_mul_equals_reference(triton_device, dtype, num_tokens, intermediate):
    """1100 columns span two programs of the row (BLOCK_I = 1024), the second one ragged."""
    act = SiluAndMul()
    x = randn(num_tokens, 2 * intermediate, dtype=dtype, device=triton_device) * 4  # [T, 2 * I]
    out = act.forward_triton(x)
    assert out.shape == (num_tokens, intermediate)
    torch.testing.assert_close(out, act.forward_native(x), **TOL[dtype])


class OpNames(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket._qualified_op_name)
        return func(*args, **(kwargs or {}))


def test_cpu_tensors_take_the_native_path():
    norm, x = RMSNorm(8), torch.randn(3, 8)
    with OpNames() as seen:
        norm(x, x)
    assert "aten::rsqrt" in seen.names and not any(n.startswith("kvmesh::") for n in seen.names)


def test_forcing_picks_the_path_whatever_the_device(triton_device):
    norm, x = RMSNorm(8).to(triton_device), torch.randn(3, 8, device=triton_device)
    force_triton(norm)
    with OpNames() as seen:
        norm(x, x)
    assert seen.names == ["kvmesh::fused_add_rms_norm"]
    force_triton(norm, False)
    with OpNames() as seen:
        norm(x, x)
    assert "aten::rsqrt" in seen.names and not any(n.startswith("kvmesh::") for n in seen.names)


def test_the_triton_ops_run_on_meta_tensors(triton_device):
    """torch.ops.kvmesh.* have meta implementations: shapes only, no kernel."""
    from kvmesh.replica.layers.custom_op import triton_ops

    x = torch.empty(4, 16, device="meta")
    out, residual = triton_ops().fused_add_rms_norm.default(x, x, torch.empty(16, device="meta"), 1e-6)
    assert out.shape == residual.shape == (4, 16) and out.device.type == "meta"
    assert triton_ops().silu_and_mul.default(x).shape == (4, 8)
