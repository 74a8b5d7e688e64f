"""Tokenize once: the router forwards the prompt token ids it computed, so a replica does not tokenize again.

What each kind of upstream gets (the kind comes from its ``/server_info``, read when it becomes healthy):

    upstream                      /v1/completions                      /v1/chat/completions
    kvmesh (same tokenizer)       ``prompt`` -> the ids (not with echo) ``prompt_token_ids``: the rendered ids
    vLLM / says nothing           ``prompt`` -> the ids (not with echo, as sent
                                  nor with vLLM's tokenizing options)
    tokenizer fingerprint differs as sent                               as sent

The body each upstream gets is built by the request itself (``ProxyRequest.for_kind``, router/http/proxy_request.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvmesh.router.replicas.replica import KVMESH, TEXT, VLLM, UpstreamKind

if TYPE_CHECKING:
    from kvmesh.replica.serving.tokenizer import Tokenizer
VLLM_TOKENIZING_KEYS = frozenset({"add_special_tokens", "truncate_prompt_tokens", "prompt_embeds"})
"""vLLM completion options that change a text prompt's ids (kvmesh ignores them): such bodies go as sent."""
ServerInfo = dict[str, object]
"""A replica's ``/server_info`` JSON object (free-form: each kind of server says what it says)."""


def upstream_kind(info: ServerInfo | None, tokenizer: Tokenizer | None) -> UpstreamKind:
    """KVMESH, VLLM or TEXT for a replica whose ``/server_info`` answered ``info`` (None: it did not answer)."""
    if not isinstance(info, dict):
        return VLLM
    fingerprint, ours = info.get("tokenizer_fingerprint"), tokenizer.fingerprint if tokenizer is not None else None
    if isinstance(fingerprint, str) and ours is not None and fingerprint != ours:
        return TEXT
    return KVMESH if info.get("version") == KVMESH else VLLM
