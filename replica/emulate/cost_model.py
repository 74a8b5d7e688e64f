"""The step-time cost model: how long one engine step takes on a GPU, linear in its work.

A step runs a batch of prefill chunks and decode tokens together (continuous batching, no
prefill/decode phases). Its duration is linear in the work::

    step_s = step_overhead_s
           + prefill_s_per_token * (prefill tokens computed this step)      # uncached tokens only
           + load_s_per_token * (prompt tokens loaded back from the host tier)
           + decode_s_per_step + decode_s_per_seq * (decoding sequences)   # when any sequence decodes
           + decode_s_per_context_token * (sum of their context lengths)    # KV reads

Defaults describe an H100-class GPU serving an 8B Llama-3 model in bf16 with a vLLM-style
engine: ~12k prefill tokens/s at long context (2 x 8e9 FLOPs per token at ~40% of 989 TFLOPs,
less attention overhead), a ~8 ms decode step dominated by reading 16 GB of weights at
3.35 TB/s, and 128 KiB of KV per token (32 layers x 8 KV heads x 128 dims x K,V x bf16) read
back once per decode step.

One model for two users: the simulator's replicas (``kvmesh sim``) and the emulated replica's runner
(``kvmesh replica --emulate h100-8b``), so both wait the same seconds for the same batch. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

H100_8B_KV_BYTES_PER_TOKEN = 131_072
"""KV bytes of one token of the cost model's 8B Llama-3 in bf16: 32 layers x 8 KV heads x 128 x K,V x 2 bytes."""


@dataclass(frozen=True, slots=True)
class CostModel:
    """Linear step-time model; every constant is in seconds."""

    step_overhead_s: float = 0.002
    """Fixed cost of any step: scheduling, kernel launches, sampling."""
    prefill_s_per_token: float = 1.0 / 12_000
    """Time per uncached prompt token computed (8B model: ~12k tokens/s on an H100)."""
    decode_s_per_step: float = 0.006
    """Extra fixed cost of a step that decodes at least one sequence (weight reads: 16 GB / 3.35 TB/s ~ 5 ms)."""
    decode_s_per_seq: float = 0.00005
    """Per decoding sequence in the batch (sampling, per-sequence kernels)."""
    decode_s_per_context_token: float = 131_072 / 3.35e12
    """Per context token of each decoding sequence: 128 KiB of KV read at 3.35 TB/s (~39 ns)."""
    load_s_per_token: float = 131_072 / 25e9
    """Per prompt token loaded back from the host tier: 128 KiB of KV over PCIe at ~25 GB/s (~5 us)."""

    def __post_init__(self) -> None:
        for name in ("step_overhead_s", "prefill_s_per_token", "decode_s_per_step",
                     "decode_s_per_seq", "decode_s_per_context_token", "load_s_per_token"):
            value = getattr(self, name)
            if not value >= 0:
                raise ValueError(f"CostModel.{name} must be >= 0 seconds, got {value!r}")
        if self.step_overhead_s + self.prefill_s_per_token + self.decode_s_per_step <= 0:
            raise ValueError("CostModel: a step must take some time (all constants are 0)")

    def step_time(self, num_prefill_tokens: int, num_decode_seqs: int, decode_context_tokens: int,
                  num_loaded_tokens: int = 0) -> float:
        """Seconds for one step computing ``num_prefill_tokens`` prompt tokens and decoding
        ``num_decode_seqs`` sequences whose contexts sum to ``decode_context_tokens``, after loading
        ``num_loaded_tokens`` back from the host tier (the prefill waits for them)."""
        t = (self.step_overhead_s + self.prefill_s_per_token * num_prefill_tokens
             + self.load_s_per_token * num_loaded_tokens)
        if num_decode_seqs:
            t += (self.decode_s_per_step + self.decode_s_per_seq * num_decode_seqs
                  + self.decode_s_per_context_token * decode_context_tokens)
        return t
