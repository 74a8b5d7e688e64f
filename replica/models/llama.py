"""Llama-family decoder (Llama 2/3, Mistral, Qwen2) over paged attention, nano-vllm style.

Module names match Hugging Face checkpoints except the fused projections listed in
``packed_modules_mapping`` (q/k/v -> qkv_proj, gate/up -> gate_up_proj). Tokens of all
requests of a step are flattened: activations are [T, hidden].

A decoder layer launches 9 kernels on CUDA with the triton backend (RMSNorm and SiLU·mul are fused
Triton kernels, ``replica/layers/custom_op.py``; the rotary embedding is folded into the backend's
cache write; the plain-torch layers on CPU/meta launch ~40):

    add+rms_norm -> qkv GEMM -> rotary + K/V cache write -> attention -> o_proj GEMM (+ all-reduce)
    -> add+rms_norm -> gate_up GEMM -> silu_and_mul -> down GEMM (+ all-reduce)

(other backends: rotary on q and k in place, then the backend's own write and attention).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from kvmesh.replica.attention.layer import Attention
from kvmesh.replica.distributed.parallel_state import SINGLE, ParallelState, divide
from kvmesh.replica.layers.activation import SiluAndMul
from kvmesh.replica.layers.embed_head import ParallelLMHead, VocabParallelEmbedding
from kvmesh.replica.layers.layernorm import RMSNorm
from kvmesh.replica.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from kvmesh.replica.layers.rotary import RotaryEmbedding
from kvmesh.replica.model_config import ModelSpec
from torch import nn

if TYPE_CHECKING:
    from kvmesh.replica.attention.backend import AttentionMetadata


class LlamaAttention(nn.Module):
    def __init__(self, spec: ModelSpec, rotary: RotaryEmbedding, parallel: ParallelState) -> None:
        super().__init__()
        self.qkv_proj = QKVParallelLinear(spec.hidden_size, spec.head_dim, spec.num_attention_heads,
                                          spec.num_key_value_heads, bias=spec.qkv_bias, parallel=parallel)
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.head_dim = spec.head_dim
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.o_proj = RowParallelLinear(spec.num_attention_heads * spec.head_dim, spec.hidden_size,
                                        bias=spec.o_bias, parallel=parallel)
        self.rotary_emb = [rotary]  # shared by all layers; a list so it is not registered once per layer
        self.attn = Attention(self.num_heads, self.head_dim, self.num_kv_heads, self.head_dim**-0.5)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, attn_metadata: AttentionMetadata) -> torch.Tensor:
        qkv = self.qkv_proj(hidden)  # [T, (Hq + 2 Hk) * Dh]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)  # [T, Hq, Dh]
        k = k.view(-1, self.num_kv_heads, self.head_dim)  # [T, Hk, Dh]
        v = v.reshape(-1, self.num_kv_heads, self.head_dim)
        rotary = self.rotary_emb[0]
        if self.attn.fuses_rotary(rotary.uses_triton(q)):  # rotated in the backend's cache-write launch
            o = self.attn(q, k, v, attn_metadata, (positions, rotary.cos_sin_cache))  # [T, Hq, Dh]
        else:
            q, k = rotary(positions, q, k)
            o = self.attn(q, k, v, attn_metadata)  # [T, Hq, Dh]
        return self.o_proj(o.view(-1, self.q_size))


class LlamaMLP(nn.Module):
    def __init__(self, spec: ModelSpec, parallel: ParallelState) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(spec.hidden_size, [spec.intermediate_size] * 2,
                                                       bias=spec.mlp_bias, parallel=parallel)
        self.down_proj = RowParallelLinear(spec.intermediate_size, spec.hidden_size, bias=spec.mlp_bias,
                                           parallel=parallel)
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, rotary: RotaryEmbedding, parallel: ParallelState) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(spec, rotary, parallel)
        self.mlp = LlamaMLP(spec, parallel)
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None,
                attn_metadata: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden, attn_metadata)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaModel(nn.Module):
    def __init__(self, spec: ModelSpec, max_position: int, parallel: ParallelState) -> None:
        super().__init__()
        divide(spec.num_attention_heads, parallel.tp_size, "num_attention_heads")
        self.embed_tokens = VocabParallelEmbedding(spec.vocab_size, spec.hidden_size, parallel)
        self.rotary_emb = RotaryEmbedding(spec.head_dim, max_position, spec.rope_theta, spec.rope_scaling)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(spec, self.rotary_emb, parallel) for _ in range(spec.num_hidden_layers)
        )
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                attn_metadata: AttentionMetadata) -> torch.Tensor:
        hidden, residual = self.embed_tokens(input_ids), None  # [T, H]
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual, attn_metadata)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class LlamaForCausalLM(nn.Module):
    packed_modules_mapping = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }

    def __init__(self, spec: ModelSpec, max_position: int, parallel: ParallelState = SINGLE) -> None:
        super().__init__()
        self.spec = spec
        self.model = LlamaModel(spec, max_position, parallel)
        self.lm_head = ParallelLMHead(spec.vocab_size, spec.hidden_size, parallel)
        if spec.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def attention_layers(self) -> list[Attention]:
        return [layer.self_attn.attn for layer in self.model.layers]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                attn_metadata: AttentionMetadata) -> torch.Tensor:
        """input_ids/positions [T] -> final hidden states [T, H]."""
        return self.model(input_ids, positions, attn_metadata)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, H] -> logits [N, vocab]."""
        return self.lm_head(hidden)
