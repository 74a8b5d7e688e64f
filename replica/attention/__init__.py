"""Paged attention: typed per-step metadata, a backend registry ("torch", "flash_attn"), the layer."""
