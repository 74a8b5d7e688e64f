"""Where a tokenizer's input may be cut at a space without changing its token ids.

``CachedTokenizer`` (router/routing/tokenize_cache.py) cuts long text into chunks so prompts that share a
long prefix share its cached chunks. A cut is only made where the tokenizer's own pipeline
already separates the two sides, which holds for two families, recognised from tokenizer.json:

**SentencePiece-style BPE** (stories260K, Llama 2, Mistral): no normalizer, a ``Metaspace``
pre-tokenizer (spaces become ``▁``) and a BPE with no token holding ``▁`` past its first
character. No merge can then produce a token across a ``▁``, so the text before any space
tokenizes independently of the text from that space on. Cut rule: before any space.

**Byte-level BPE with a known split regex** (GPT-2, Llama 3, Qwen 2): no normalizer, the regex
splits words before ByteLevel maps bytes and BPE runs per word. In these regexes (listed below,
compared verbatim) a space is never inside a match that starts before it when the character
before it is not whitespace (letters, digits and punctuation runs stop at a space; whitespace
runs start at one), the match that takes it (`` ?\\p{L}+`` / ``[^\\r\\n\\p{L}\\p{N}]?\\p{L}+``) starts
at it, and no alternative looks behind. So the matches before the cut end there and the ones
after it start there, in the whole text as in the two parts. Cut rule: before a space that
follows a non-space character and precedes an ASCII letter (Python's whitespace is a superset of
the regex's ``\\s``; ASCII letters are ``\\p{L}`` under any Unicode version).

Anything else (a normalizer, other pre-tokenizers or regexes, BPE dropout, word prefixes or
suffixes, ``normalized`` added tokens that a cut could split) gets no cuts.
"""

from __future__ import annotations

import json
import re

KNOWN_SPLIT_REGEXES = frozenset({
    # Llama 3 (and OpenAI's cl100k_base)
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+",
    # Qwen 2 / 2.5 (digits one by one)
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
})
"""Split regexes (verbatim, as in tokenizer.json) whose matches never straddle a space after a word."""

ANY_SPACE = re.compile(" ")
SPACE_BEFORE_WORD = re.compile(r"(?<=\S) (?=[A-Za-z])")


def space_cut_pattern(backend) -> re.Pattern | None:
    """The regex whose matches (single spaces) are safe cut points of ``backend``'s input, or None."""
    spec = json.loads(backend.to_str())
    model = spec.get("model") or {}
    if spec.get("normalizer") is not None or model.get("type") != "BPE":
        return None
    if model.get("dropout") or model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        return None
    if any(tok.get("normalized") for tok in spec.get("added_tokens", ())):
        return None  # matched inside pieces: a cut could split one
    pre = spec.get("pre_tokenizer") or {}
    if pre.get("type") == "Metaspace":
        mark = pre.get("replacement", "\u2581")
        return None if any(mark in token[1:] for token in model.get("vocab", {})) else ANY_SPACE
    if pre.get("type") == "ByteLevel" and pre.get("use_regex", True):
        return SPACE_BEFORE_WORD  # GPT-2's built-in regex
    if pre.get("type") == "Sequence":
        steps = pre.get("pretokenizers") or []
        if (len(steps) == 2 and steps[0].get("type") == "Split" and steps[1].get("type") == "ByteLevel"
                and not steps[1].get("use_regex", True) and steps[0].get("behavior") == "Isolated"
                and not steps[0].get("invert") and (steps[0].get("pattern") or {}).get("Regex") in KNOWN_SPLIT_REGEXES):
            return SPACE_BEFORE_WORD
    return None
