"""The draft model of speculative decoding's ``method: "draft_model"``: a smaller model with the target's
tokenizer, run by the same engine (vLLM's ``DraftModelProposer``), over a paged KV cache of its own.

    draft cache:  its own blocks and block table per request (spec_decode/draft_proposer.py keeps them), never
                  hashed, cached or published: only the target's blocks are the replica's prefix cache
    forward:      the rows of one call (each a request's next tokens from a position) in one batch; the logits
                  at each row's last token come back

The model is built by the target's path (``build_model``: the same layers, attention backends and weight
loaders), in the target's dtype and device, its cache in the model's dtype. A draft whose vocabulary differs
from the target's is refused naming both (its tokens would mean other words).
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

import torch
from kvmesh.replica.attention.backend import get_attn_backend
from kvmesh.replica.attention.metadata import CommonAttentionMetadata
from kvmesh.replica.model_config import load_hf_config, resolve_dtype, spec_from_hf_config
from kvmesh.replica.spec_decode.draft_proposer import DraftRow
from kvmesh.replica.worker.device import pick_device
from kvmesh.replica.worker.kv_cache import allocate_kv_cache
from kvmesh.replica.worker.weights import build_model

if TYPE_CHECKING:
    from kvmesh.replica.config import EngineConfig


def check_same_vocabulary(target_dir: str, target_vocab: int, draft_dir: str, draft_vocab: int) -> None:
    """Raise ValueError naming both vocabularies when the draft's tokens are not the target's."""
    tokens = [_tokenizer_vocab(target_dir), _tokenizer_vocab(draft_dir)]
    if draft_vocab == target_vocab and (None in tokens or tokens[0] == tokens[1]):
        return
    sizes = [target_vocab, draft_vocab] if draft_vocab != target_vocab else [len(t) for t in tokens]
    raise ValueError(f"speculative_config.model {draft_dir!r} has a vocabulary of {sizes[1]} tokens that is not "
                     f"the target {target_dir!r}'s vocabulary of {sizes[0]} tokens: a draft model must use the "
                     "target's tokenizer")


def _tokenizer_vocab(model_dir: str) -> dict | None:
    """token -> id of the directory's tokenizer.json (None: it has none)."""
    path = os.path.join(model_dir, "tokenizer.json")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        tok = json.load(f)
    vocab = dict(tok.get("model", {}).get("vocab") or {})
    vocab.update({t["content"]: t["id"] for t in tok.get("added_tokens") or []})
    return vocab


class DraftModel:
    """The draft model and its KV cache of ``num_blocks`` blocks (block 0 is the null block)."""

    def __init__(self, model_dir: str, config: EngineConfig, target_vocab: int, max_model_len: int,
                 num_blocks: int) -> None:
        spec = spec_from_hf_config(load_hf_config(model_dir))
        check_same_vocabulary(config.tokenizer_path, target_vocab, model_dir, spec.vocab_size)
        if not os.path.isdir(model_dir) or not any(f.endswith(".safetensors") for f in os.listdir(model_dir)):
            raise ValueError(f"speculative_config.model {model_dir!r} has no *.safetensors weights")
        self.device = pick_device(config.device, 0)
        self.dtype = resolve_dtype(config.dtype, spec, self.device)
        self.block_size, self.num_blocks = config.block_size, num_blocks
        self.model = build_model(spec, max_model_len, self.dtype, self.device, model_dir, "safetensors",
                                 config.seed)
        self.backend = get_attn_backend(config.attention_backend, self.device, self.dtype, self.block_size)
        layers = self.model.attention_layers()
        attn0 = layers[0]
        shape = self.backend.kv_cache_shape(num_blocks, self.block_size, attn0.num_kv_heads, attn0.head_dim)
        self.kv_cache = allocate_kv_cache(len(layers), shape, self.dtype, self.device)
        for i, attn in enumerate(layers):
            attn.backend, attn.kv_cache = self.backend, self.kv_cache[i]

    @torch.inference_mode()
    def forward(self, rows: list[DraftRow]) -> torch.Tensor:
        """Write the rows' K/V into the draft cache; the logits [len(rows), V] after each row's last token.
        Rows of one token come first (the backends' order: decodes, then prefill chunks)."""
        bs, dev = self.block_size, self.device
        lens = [len(r.token_ids) for r in rows]
        ids = [t for r in rows for t in r.token_ids]
        pos = [p for r in rows for p in range(r.start, r.start + len(r.token_ids))]
        slots = [r.block_ids[p // bs] * bs + p % bs for r in rows for p in range(r.start, r.start + len(r.token_ids))]
        width = max(len(r.block_ids) for r in rows)
        tables = torch.zeros(len(rows), width, dtype=torch.int32)
        for i, r in enumerate(rows):
            tables[i, :len(r.block_ids)] = torch.tensor(r.block_ids, dtype=torch.int32)
        qsl = [0]
        for n in lens:
            qsl.append(qsl[-1] + n)
        seq_lens = [r.start + n for r, n in zip(rows, lens, strict=True)]
        common = CommonAttentionMetadata(
            num_reqs=len(rows), num_decodes=sum(n == 1 for n in lens), num_actual_tokens=len(ids),
            max_query_len=max(lens), max_seq_len=max(seq_lens), block_size=bs,
            query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev), block_tables=tables.to(dev),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev), query_start_loc_cpu=qsl,
            seq_lens_cpu=seq_lens, block_tables_cpu=tables.numpy())
        hidden = self.model(torch.tensor(ids, device=dev), torch.tensor(pos, device=dev),
                            self.backend.build(common))
        last = torch.tensor([q - 1 for q in qsl[1:]], device=dev)
        return self.model.compute_logits(hidden[last]).to(torch.float32)
