"""The rule "an engine reuses all but the prompt's last token", written once (kvcache/reuse.py)."""

from __future__ import annotations

from kvmesh.kvcache.reuse import reusable_blocks, reusable_tokens


def test_the_block_holding_the_last_token_is_never_reused():
    assert [reusable_blocks(n, 16) for n in (0, 1, 16, 17, 32, 33)] == [0, 0, 0, 1, 1, 2]
    assert reusable_tokens(5, 33, 16) == 32 and reusable_tokens(1, 33, 16) == 16 and reusable_tokens(0, 33, 16) == 0
    assert reusable_tokens(3, 0, 16) == 0
