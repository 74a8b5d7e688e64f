"""Model shapes and workload sizes of ``kvmesh bench engine-speed``: one preset per target machine.

``tinyllama-1.1b`` is the shape of the GPU reference run (/work/shared/notes/gpu-first-contact.md):
TinyLlama-1.1B with random weights, 256 requests at once, decode steps at 1/64/256 running
sequences of 512-token context, TTFT of a 2,048-token prefix + 16 new tokens. ``tiny`` keeps every
measurement but scales the model down and the workload to a quarter (the same 256 requests with a
quarter of the prompt and output lengths; a quarter of the batches, contexts and budgets), so a CPU
run takes seconds (and CI, with a smaller workload still, can run it).
"""

from __future__ import annotations

from dataclasses import dataclass

HFConfigValue = str | int | float | bool
"""A value of a Hugging Face config field (the presets set only scalars)."""


@dataclass(frozen=True, slots=True)
class Preset:
    """A random-weight Llama and the workload that measures it."""

    name: str
    """Registry name (``--preset``)."""
    hf_config: tuple[tuple[str, HFConfigValue], ...]
    """The model's Hugging Face config fields (Llama), as pairs so the preset stays hashable."""
    num_requests: int
    """Requests of the throughput workload, all submitted at once."""
    prompt_len: tuple[int, int]
    """Prompt length range (inclusive) of the throughput workload, in tokens."""
    output_len: tuple[int, int]
    """Output length range (inclusive) of the throughput workload, in tokens."""
    decode_batches: tuple[int, ...]
    """Running sequences at which a decode step is timed."""
    decode_context: int
    """Prompt tokens of each sequence in the decode-step measurement."""
    ttft_prefix_len: int
    """Cached prefix of the TTFT measurement (16 new tokens follow it); a multiple of every block size used."""
    max_num_batched_tokens: int
    """Token budget of one engine step."""
    hf_batch_size: int
    """Static batch size of the Hugging Face ``generate`` baseline."""

    @property
    def config(self) -> dict[str, HFConfigValue]:
        return dict(self.hf_config)


def _llama(**fields: HFConfigValue) -> tuple[tuple[str, HFConfigValue], ...]:
    base: dict[str, HFConfigValue] = dict(model_type="llama", rms_norm_eps=1e-5, rope_theta=10000.0,
                bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, torch_dtype="bfloat16")
    return tuple(sorted({**base, **fields}.items()))


PRESETS: dict[str, Preset] = {
    "tiny": Preset(
        name="tiny",
        hf_config=_llama(hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=1000, max_position_embeddings=1024),
        num_requests=256, prompt_len=(16, 256), output_len=(16, 64), decode_batches=(1, 16, 64),
        decode_context=128, ttft_prefix_len=512, max_num_batched_tokens=2048, hf_batch_size=16),
    # TinyLlama-1.1B's shape; max_position_embeddings 4096 (TinyLlama's is 2048) so 2,048 + 16 fits.
    "tinyllama-1.1b": Preset(
        name="tinyllama-1.1b",
        hf_config=_llama(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                         num_key_value_heads=4, vocab_size=32000, max_position_embeddings=4096),
        num_requests=256, prompt_len=(64, 1024), output_len=(64, 256), decode_batches=(1, 64, 256),
        decode_context=512, ttft_prefix_len=2048, max_num_batched_tokens=8192, hf_batch_size=64),
}
