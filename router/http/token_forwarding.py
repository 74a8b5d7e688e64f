"""Tokenize once: the router forwards the prompt token ids it computed, so a replica does not tokenize again.

What each kind of upstream gets (the kind comes from its ``/server_info``, read when it becomes healthy):

    upstream                      /v1/completions                      /v1/chat/completions
    kvmesh (same tokenizer)       ``prompt`` -> the ids (not with echo) ``prompt_token_ids``: the rendered ids
    vLLM / says nothing           ``prompt`` -> the ids (not with echo, as sent
                                  nor with vLLM's tokenizing options)
    tokenizer fingerprint differs as sent                               as sent

Rewriting is exact: a replica range-checks token ids and uses them as they are, and the router computed
them with the replica's own rules (replica/serving/tokenizer.py). ``echo`` is excluded because the echoed
text must be the client's own; a batch of prompts is rewritten only as a whole. Everything else in the body
(``cache_salt``, sampling parameters, ``stream``, ``return_token_ids``) is kept as sent.
"""

from __future__ import annotations

from typing import Any

import msgspec

KVMESH = "kvmesh"
"""A kvmesh replica with the router's tokenizer and chat template: completions and chat carry token ids."""
VLLM = "vllm"
"""An upstream that does not say it is kvmesh (vLLM): completions carry token ids, chat goes as sent."""
TEXT = "text"
"""An upstream whose ids may differ from the router's (tokenizer fingerprint mismatch): bodies go as sent."""
VLLM_TOKENIZING_KEYS = frozenset({"add_special_tokens", "truncate_prompt_tokens", "prompt_embeds"})
"""vLLM completion options that change a text prompt's ids (kvmesh ignores them): such bodies go as sent."""
_QUOTED_VLLM_TOKENIZING_KEYS = tuple(f'"{key}"'.encode() for key in sorted(VLLM_TOKENIZING_KEYS))
"""The same, as they appear in raw JSON (built once: formatting them per request cost ~5 µs)."""


def upstream_kind(info: Any, tokenizer: Any) -> str:
    """KVMESH, VLLM or TEXT for a replica whose ``/server_info`` answered ``info`` (None: it did not answer)."""
    if not isinstance(info, dict):
        return VLLM
    fingerprint, ours = info.get("tokenizer_fingerprint"), getattr(tokenizer, "fingerprint", None)
    if isinstance(fingerprint, str) and ours is not None and fingerprint != ours:
        return TEXT
    return KVMESH if info.get("version") == KVMESH else VLLM


class UpstreamBody:
    """One request's body per kind of upstream: the client's bytes, or them with the router's token ids.

    ``prompts`` are the ids the router computed (one list per prompt; empty: none, e.g. no tokenizer);
    ``enabled`` is ``RouterConfig.forward_token_ids``. Rewritten bodies are built once, on first use."""

    def __init__(self, raw: bytes, req: Any = None, prompts: list[list[int]] | None = None, chat: bool = False,
                 enabled: bool = False) -> None:
        self.raw = raw
        """The body as the client sent it (plus ``return_token_ids`` for a stream the router may migrate)."""
        self._req, self._prompts, self._chat = req, prompts or [], chat
        self._enabled = enabled and bool(self._prompts)
        self._built: dict[str, bytes] = {}

    def ask_for_token_ids(self) -> None:
        """Streams: ask every upstream for the token ids behind the text (router/http/migration.py)."""
        from kvmesh.router.http.migration import ask_for_token_ids

        self.raw = ask_for_token_ids(self.raw)
        self._built.clear()

    def forwards_ids(self, kind: str) -> bool:
        """Whether an upstream of ``kind`` gets the router's token ids for this request."""
        if not self._enabled or kind == TEXT:
            return False
        if self._chat:  # a chat that came with its ids goes as sent (they are what the router routed by)
            return kind == KVMESH and getattr(self._req, "prompt_token_ids", None) is None
        if self._req.echo:
            return False  # the echoed prompt must be the client's text, not the ids decoded
        if isinstance(self._req.prompt, list) and self._req.prompt and isinstance(self._req.prompt[0], int):
            return False  # already token ids
        if kind == VLLM:
            return not self._names_vllm_tokenizing_key()
        return True

    def for_kind(self, kind: str) -> bytes:
        """The bytes to send to an upstream of ``kind``."""
        if not self.forwards_ids(kind):
            return self.raw
        key = "prompt_token_ids" if self._chat else "prompt"
        if key not in self._built:
            self._built[key] = self._chat_body() if self._chat else self._completion_body()
        return self._built[key]

    def _chat_body(self) -> bytes:
        head = self.raw.rstrip()
        if head.endswith(b"}") and b'"prompt_token_ids"' not in head:  # appended: the messages are not re-encoded
            return head[:-1] + b',"prompt_token_ids":' + msgspec.json.encode(self._prompts[0]) + b"}"
        body = msgspec.json.decode(self.raw)  # e.g. "prompt_token_ids": null as sent
        body["prompt_token_ids"] = self._prompts[0]
        return msgspec.json.encode(body)

    def _completion_body(self) -> bytes:
        body = msgspec.json.decode(self.raw)  # one prompt stays one; a batch becomes a batch of id lists, in order
        single = not _is_batch(body["prompt"])
        assert len(self._prompts) == (1 if single else len(body["prompt"])), "one id list per prompt"
        body["prompt"] = self._prompts[0] if single else self._prompts
        return msgspec.json.encode(body)

    def _names_vllm_tokenizing_key(self) -> bool:
        # A quoted name in the raw JSON: a key, or a string value (then the body just goes as sent);
        # inside a string, a quote is escaped, so prompt text cannot match.
        raw = self.raw
        return any(quoted in raw for quoted in _QUOTED_VLLM_TOKENIZING_KEYS)


def _is_batch(prompt: Any) -> bool:
    return isinstance(prompt, list) and bool(prompt) and not isinstance(prompt[0], int)
