"""What the serving core and the engine use of a Hugging Face tokenizer, written down as Protocols."""

from __future__ import annotations

from typing import Protocol

from kvmesh.replica.serving.json_types import JSONObject


class HFTokenizer(Protocol):
    """The part of a ``transformers`` tokenizer (``PreTrainedTokenizerFast`` and kin) kvmesh calls."""

    bos_token_id: int | None
    """Beginning-of-sequence token id, if the model has one."""
    eos_token_id: int | None
    """End-of-sequence token id, if the model has one."""
    chat_template: str | dict[str, str] | None
    """The model's own chat template(s) (a dict maps template names to templates)."""
    special_tokens_map: dict[str, str | list[str]]
    """``bos_token``, ``eos_token``, ...: the variables a chat template gets besides the chat."""
    model_max_length: int
    """The tokenizer config's context length (transformers' ``VERY_LARGE_INTEGER`` when unset)."""

    def __len__(self) -> int: ...

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str: ...

    def get_vocab(self) -> dict[str, int]: ...

    def apply_chat_template(self, conversation: list[JSONObject], chat_template: str | None = None,
                            add_generation_prompt: bool = False, tokenize: bool = True) -> str: ...


class TokenCache(Protocol):
    """Where ``Tokenizer.encode`` gets its ids when set (the router's ``CachedTokenizer``): exactly ``hf``'s ids."""

    def encode(self, text: str, add_special_tokens: bool, max_fresh_chars: int | None = None) -> list[int] | None: ...
