"""Torch-free tokenizer loading and prompt rendering, shared by the replica and the router.

The router must turn a request into exactly the token ids the replica will compute, or its
prefix keys miss. So both sides call the same two functions here:

    render_completion(prompt)   str -> encode(prompt, add_special_tokens=True)   (BOS added as HF does)
                                list[int] -> used as is
    render_chat(messages)       apply the chat template to text, then
                                encode(text, add_special_tokens=False)           (the template already
                                                                                  holds BOS etc. - vLLM's rule)

``transformers.AutoTokenizer`` imports torch; ``PreTrainedTokenizerFast`` (the ``tokenizers``
backend fed by tokenizer.json + tokenizer_config.json) does not, and gives the same ids.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Protocol

import msgspec
from kvmesh.replica.serving.errors import ProtocolError
from kvmesh.replica.serving.hf_tokenizer import HFTokenizer, TokenCache
from kvmesh.replica.serving.json_types import JSONObject

NO_CHAT_TEMPLATE = (
    "this model's tokenizer defines no chat template, so chat requests cannot be rendered (as in vLLM: "
    "\"default chat template is no longer allowed\"); start the server with --chat-template FILE_OR_TEXT "
    "(frontend.chat_template), or send the prompt as text to /v1/completions"
)
"""The answer (400) to a chat request for a model without a chat template: vLLM's, plus what to do."""

# Keys of a Hugging Face config.json that hold the model's context length, most specific first.
_MAX_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length")
VERY_LARGE_LENGTH = int(1e30)  # transformers' own "no limit" value
DEFAULT_MAX_MODEL_LEN = 2048
"""Context length assumed when neither config.json nor tokenizer_config.json says."""


def _resolve_file(model: str, filename: str, revision: str | None = None) -> Path | None:
    """``filename`` from a local model directory or the Hugging Face hub cache; None if missing."""
    local = Path(model) / filename
    if local.is_dir() or Path(model).is_dir():
        return local if local.exists() else None
    try:
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(model, filename, revision=revision))
    except Exception:
        return None


def model_max_len(model: str, revision: str | None = None) -> int | None:
    """The context length in the model's config.json (text_config for multimodal ones), or None."""
    path = _resolve_file(model, "config.json", revision)
    if path is None:
        return None
    cfg = json.loads(path.read_text())
    cfg = cfg.get("text_config", cfg)
    for key in _MAX_LEN_KEYS:
        if isinstance(cfg.get(key), int) and cfg[key] > 0:
            return int(cfg[key])
    return None


class TemplateMessage(Protocol):
    """A chat message that gives its template form (``chat_message.ChatMessage``)."""

    def to_template_dict(self) -> JSONObject: ...


ChatMessageLike = JSONObject | TemplateMessage
"""A chat message as ``render_chat`` takes it: a plain dict, or a message that gives one."""


class Tokenizer:
    """A model's tokenizer plus the rules for turning requests into token ids."""

    def __init__(self, hf_tokenizer: HFTokenizer, max_model_len: int, chat_template: str | None = None, name: str = "",
                 cache: TokenCache | None = None):
        self.hf = hf_tokenizer
        """The ``transformers`` fast tokenizer (tokenizers backend, no torch)."""
        self.max_model_len = max_model_len
        """Most tokens (prompt + output) a request may hold."""
        self.chat_template = chat_template or getattr(hf_tokenizer, "chat_template", None)
        """Jinja chat template: the configured one, else the model's own; None refuses chat (as vLLM)."""
        self.name = name
        self.cache = cache
        """Where ``encode`` gets its ids when set: an object whose ``encode(text, add_special_tokens,
        max_fresh_chars=None)`` gives exactly ``hf``'s ids (the router's ``CachedTokenizer``,
        router/routing/tokenize_cache.py); None: ``hf`` encodes every call."""
        self._special_tokens: dict[str, str | list[str]] | None = None

    # ------------------------------------------------------------ properties
    @property
    def bos_token_id(self) -> int | None:
        return self.hf.bos_token_id

    @property
    def eos_token_id(self) -> int | None:
        return self.hf.eos_token_id

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    # ------------------------------------------------------------ encoding
    @functools.cached_property
    def fingerprint(self) -> str:
        """What makes two fronts turn a request into the same token ids: the tokenizer's whole
        definition (vocabulary, merges, normalizer, added tokens) and the chat template, hashed.
        The router compares it with each replica's (``/server_info``) so a mismatch degrades that
        replica to load-only routing instead of matching keys that can never hit."""
        backend = getattr(self.hf, "backend_tokenizer", None)
        definition = backend.to_str() if backend is not None else repr(sorted(self.hf.get_vocab().items()))
        digest = hashlib.sha256(definition.encode())
        digest.update(b"\0" + (self.chat_template or "").encode())
        return digest.hexdigest()[:16]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if self.cache is not None:
            return self.cache.encode(text, add_special_tokens)
        return list(self.hf.encode(text, add_special_tokens=add_special_tokens))

    def encode_within(self, text: str, add_special_tokens: bool, max_fresh_chars: int) -> list[int] | None:
        """``encode``, or None (nothing done) when more than ``max_fresh_chars`` characters would be tokenized
        afresh (all of them without a cache; with one, those of pieces not cached): the renderer keeps cheap
        work on the event loop this way and sends the rest to its threads."""
        if self.cache is not None:
            return self.cache.encode(text, add_special_tokens, max_fresh_chars)
        return self.encode(text, add_special_tokens) if len(text) <= max_fresh_chars else None

    @functools.cached_property
    def token_ids_type(self) -> type[list[int]]:
        """msgspec type of a list of token ids in this vocabulary."""
        from typing import Annotated

        return list[Annotated[int, msgspec.Meta(ge=0, lt=self.vocab_size)]]

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.hf.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def render_completion(self, prompt: str | list[int], add_special_tokens: bool = True) -> list[int]:
        """Token ids of a completion prompt: text is encoded with special tokens (BOS) unless told not to, ids
        pass through."""
        if isinstance(prompt, str):
            return self.encode(prompt, add_special_tokens=add_special_tokens)
        try:  # in C: ints (not bools) in [0, vocab), into a new list; anything else is looked at one by one below
            return msgspec.convert(prompt, self.token_ids_type, strict=True)
        except msgspec.ValidationError:
            ids = list(prompt)
            vocab = self.vocab_size  # len(hf) costs ~5 µs: read only on this path
            bad = next((t for t in ids if not isinstance(t, int) or not 0 <= t < vocab), None)
            if bad is not None:
                raise ProtocolError(f"prompt token id {bad} is out of range; token ids are integers in [0, {vocab})",
                                    param="prompt") from None
        return ids

    def apply_chat_template(
        self, messages: list[ChatMessageLike], add_generation_prompt: bool = True, chat_template: str | None = None,
        template_kwargs: JSONObject | None = None,
    ) -> str:
        """The chat rendered to text by the (given or the model's) template, with ``template_kwargs`` as more
        template variables."""
        if chat_template is None and self.chat_template is None:
            raise ProtocolError(NO_CHAT_TEMPLATE, param="messages")
        source = chat_template or self.chat_template
        continues = bool((template_kwargs or {}).get("continue_final_message"))  # transformers cuts the text
        if isinstance(source, str) and messages and not continues and not isinstance(
                getattr(self.hf, "chat_template", None), dict):
            from kvmesh.replica.serving.chat_template import plain, render

            dicts = [m if m.__class__ is dict else _as_dict(m) for m in messages]
            if plain(dicts):  # transformers' output, without its per-call rebuilding of the inputs
                return render(source, dicts, add_generation_prompt, self.special_tokens, template_kwargs)
        return self.hf.apply_chat_template(
            [_as_dict(m) for m in messages],
            chat_template=source,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **(template_kwargs or {}),
        )

    @property
    def special_tokens(self) -> dict[str, str | list[str]]:
        """The variables a chat template gets besides the chat (``bos_token``, ``eos_token``, ...)."""
        if self._special_tokens is None:
            self._special_tokens = dict(self.hf.special_tokens_map)
        return self._special_tokens

    def render_chat(
        self,
        messages: list[ChatMessageLike],
        add_generation_prompt: bool = True,
        chat_template: str | None = None,
    ) -> list[int]:
        """Token ids of a chat: the template output encoded without adding special tokens again."""
        text = self.apply_chat_template(messages, add_generation_prompt, chat_template)
        return self.encode(text, add_special_tokens=False)


def _as_dict(message: ChatMessageLike) -> JSONObject:
    """A template-ready message from a dict or a ``chat_message.ChatMessage``."""
    if isinstance(message, dict):
        return message
    return message.to_template_dict()


def load_tokenizer(
    model: str | os.PathLike,
    max_model_len: int | None = None,
    chat_template: str | None = None,
    revision: str | None = None,
) -> Tokenizer:
    """Load the tokenizer of ``model`` (a local Hugging Face directory or a hub id) without torch.

    ``max_model_len`` None means the model's (config.json, else tokenizer_config's
    ``model_max_length``, else ``DEFAULT_MAX_MODEL_LEN``). ``chat_template`` is a Jinja string or
    a path to a file holding one.
    """
    from transformers import PreTrainedTokenizerFast

    model = str(model)
    try:
        hf = PreTrainedTokenizerFast.from_pretrained(model, revision=revision)
    except Exception as e:
        raise ValueError(
            f"cannot load a fast tokenizer (tokenizer.json) for {model!r}: {e}. "
            "Point --model (or --tokenizer) at a Hugging Face directory that has tokenizer.json."
        ) from e
    if max_model_len is None:
        max_model_len = model_max_len(model, revision)
    if max_model_len is None:
        tok_max = getattr(hf, "model_max_length", None)
        max_model_len = int(tok_max) if isinstance(tok_max, int) and 0 < tok_max < 10**8 else DEFAULT_MAX_MODEL_LEN
    # Length checks belong to the server (with a clear 400), not to a tokenizer warning.
    hf.model_max_length = VERY_LARGE_LENGTH
    if chat_template is not None and os.path.isfile(chat_template):
        chat_template = Path(chat_template).read_text()
    return Tokenizer(hf, max_model_len=max_model_len, chat_template=chat_template, name=model)
