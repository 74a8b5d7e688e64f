"""Paged attention: typed per-step metadata, a backend registry ("triton", "flash_attn", "torch"), the layer."""
