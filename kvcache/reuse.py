"""How much of a prompt an engine may take from its prefix cache: every full block but the one holding its
last token, which is always computed (its logits give the first output token; vLLM's rule).

The one place the rule is written: the engine's cache lookup (``KVCacheManager.get_computed_blocks``), the
router's predictions and prices (router/routing/) and the simulator's counts (cluster/measure/sim/) all use
it. Pure Python: the router and the simulator import it without torch.
"""

from __future__ import annotations


def reusable_blocks(num_prompt_tokens: int, block_size: int) -> int:
    """Full blocks of a ``num_prompt_tokens``-token prompt that a cache hit may cover: all but the last token's
    (0 for an empty prompt)."""
    return (num_prompt_tokens - 1) // block_size if num_prompt_tokens > 0 else 0


def reusable_tokens(num_matched_blocks: int, num_prompt_tokens: int, block_size: int) -> int:
    """Prompt tokens an engine reuses when its cache holds the prompt's first ``num_matched_blocks`` blocks."""
    return min(num_matched_blocks, reusable_blocks(num_prompt_tokens, block_size)) * block_size
