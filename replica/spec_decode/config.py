"""``--speculative-config`` in vLLM's JSON form, read into a ``SpeculativeConfig``.

    {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
    {"model": "/models/draft", "num_speculative_tokens": 4}        (method "draft_model", inferred from "model")

Two methods are served: "ngram" (prompt lookup) and "draft_model" (a smaller model with the target's
tokenizer, run by the same engine: draft_model.py); any other method is refused with an error naming it.
"""

from __future__ import annotations

from dataclasses import dataclass

METHODS = ("ngram", "draft_model")
_KEYS = ("method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "model")
_NGRAM_KEYS = ("prompt_lookup_min", "prompt_lookup_max")


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    """How drafts are proposed (vLLM's ``SpeculativeConfig``: the n-gram and draft model fields)."""

    num_speculative_tokens: int
    """Most draft tokens proposed per request per step (K)."""
    prompt_lookup_min: int = 1
    """Shortest n-gram of the request's last tokens looked up in its earlier tokens (method "ngram")."""
    prompt_lookup_max: int = 1
    """Longest n-gram looked up (the longest match wins; method "ngram")."""
    method: str = "ngram"
    """How drafts are proposed: "ngram" (prompt lookup in the request's own prompt and output) or
    "draft_model" (the draft model ``model`` decodes K tokens)."""
    model: str | None = None
    """The draft model's Hugging Face directory (method "draft_model"; it must share the target's tokenizer)."""


def parse_speculative_config(value: object) -> SpeculativeConfig | None:
    """``value`` (vLLM's JSON object, or None) checked; raises ValueError naming the key at fault."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f"speculative_config must be a JSON object such as "
                         f'{{"method": "ngram", "num_speculative_tokens": 4}}, got {value!r}')
    unknown = sorted(set(value) - set(_KEYS))
    if unknown:
        raise ValueError(f"speculative_config has unsupported key(s) {unknown}; supported: {list(_KEYS)}")
    model = value.get("model")
    method = value.get("method", "draft_model" if model is not None else "ngram")
    if method not in METHODS:
        raise ValueError(f"speculative_config.method must be one of {METHODS}, got {method!r}")
    k = value.get("num_speculative_tokens")
    _check_int("num_speculative_tokens", k)
    if method == "draft_model":
        return _draft_model_config(value, k)
    if model is not None:
        raise ValueError(f"speculative_config.model is read by method 'draft_model' only, not {method!r}; "
                         "drop 'model' or set method to 'draft_model'")
    lo = value.get("prompt_lookup_min", value.get("prompt_lookup_max", 1))
    hi = value.get("prompt_lookup_max", lo)
    _check_int("prompt_lookup_min", lo)
    _check_int("prompt_lookup_max", hi)
    if lo > hi:
        raise ValueError(f"speculative_config.prompt_lookup_min ({lo}) must be <= prompt_lookup_max ({hi})")
    return SpeculativeConfig(k, lo, hi, method)


def _draft_model_config(value: dict, k: int) -> SpeculativeConfig:
    model = value.get("model")
    if not isinstance(model, str) or not model:
        raise ValueError(f"speculative_config.model must name the draft model's directory for method "
                         f"'draft_model', got {model!r}")
    ngram = sorted(set(value) & set(_NGRAM_KEYS))
    if ngram:
        raise ValueError(f"speculative_config key(s) {ngram} are read by method 'ngram' only, not 'draft_model'")
    return SpeculativeConfig(k, method="draft_model", model=model)


def _check_int(key: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"speculative_config.{key} must be an integer >= 1, got {value!r}")
