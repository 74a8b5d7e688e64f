"""Tokenize once, and less: text split at the tokenizer's added tokens, pieces seen before from a cache.

A Hugging Face ``tokenizers`` pipeline first cuts the text at its *added tokens* (special tokens
such as ``<|im_start|>`` and added words), then normalizes, pre-tokenizes and runs the model on
every piece between them **independently**. So the ids of a text are the concatenation of

    [post-processor prefix] + ids(piece_0) + [id(added_0)] + ids(piece_1) + ... + [suffix]

and a piece's ids depend on the piece alone, with one exception the key below carries: a
Metaspace pre-tokenizer with ``prepend_scheme="first"`` (stories260K, Llama-3-style SentencePiece
conversions) prepends ``▁`` only to a piece that starts at offset 0 of the whole text. Cache key =
(piece, starts at offset 0); a piece that does not start the text is tokenized behind an added
token (whose id is then dropped), so it sees the same context as in the whole text. Chat traffic
resends its history and shares system prompts, and a chat template wraps every message in added
tokens, so most pieces of a request were seen before.

Long pieces (a completion prompt is one piece) are also cut at spaces every ~``chunk_chars``
characters where router/routing/tokenize_cuts.py proves it exact (SentencePiece-style BPE; byte-level
BPE with a known split regex). Cuts are content-defined (the first allowed space after each
``chunk_chars`` from the piece start), so prompts sharing a long prefix share its chunks.

Where the split is not provably the tokenizer's own, nothing is cached and the plain tokenizer
runs (``uncached_reason`` says why):
- added tokens with ``lstrip``/``rstrip``/``single_word`` eat or depend on their neighbours: a text
  containing one is encoded plainly (the others still split);
- ``normalized=True`` added tokens are matched after normalization, inside a piece: they stay
  inside the cached piece (exact, just not split at);
- truncation or padding configured on the tokenizer: the whole encoding depends on the total;
- ``add_special_tokens=True`` with a post-processor that does not add a fixed prefix/suffix to a
  single sequence (probed at construction): plain encode for those calls.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Protocol, cast

from kvmesh.router.routing.tokenize_cuts import space_cut_pattern

if TYPE_CHECKING:
    import tokenizers
    from kvmesh.replica.serving.hf_tokenizer import HFTokenizer


PieceKey = tuple[str] | str
"""A piece's cache key: the piece at offset 0 of a text as a 1-tuple, any other piece as the str itself."""


class FastTokenizer(Protocol):
    """A transformers fast tokenizer: what it wraps is a ``tokenizers.Tokenizer``."""

    backend_tokenizer: tokenizers.Tokenizer

DEFAULT_MAX_CACHED_TOKENS = 1 << 20
"""Token ids kept in the piece cache by default. A cached id costs the router about 43 bytes (its list slot, the int
object, its share of the piece's text: measured with tracemalloc on stories260K), so the full cache holds some 45 MB
(what a long run's router memory gains from it at most)."""

DEFAULT_CHUNK_CHARS = 256
"""Characters between cuts of a long piece (where cutting at spaces is exact)."""

_PROBES = ("a", "Hello world, how are you?", " leading space", "\n\nline\tbreaks  ", "x y z")


def _chars(keys) -> int:
    """Characters of the pieces behind cache keys."""
    return sum(len(key[0]) if key.__class__ is tuple else len(key) for key in keys)


class CachedTokenizer:
    """``encode(text, add_special_tokens)`` with exactly the tokenizer's ids, pieces served from an LRU cache."""

    def __init__(self, tokenizer: tokenizers.Tokenizer | FastTokenizer | HFTokenizer,
                 max_cached_tokens: int = DEFAULT_MAX_CACHED_TOKENS,
                 chunk_chars: int = DEFAULT_CHUNK_CHARS) -> None:
        if max_cached_tokens < 0:
            raise ValueError(f"max_cached_tokens must be >= 0, got {max_cached_tokens}")
        self.backend = cast("tokenizers.Tokenizer", getattr(tokenizer, "backend_tokenizer", tokenizer))
        """The ``tokenizers.Tokenizer`` (a transformers fast tokenizer is unwrapped to it)."""
        self.max_cached_tokens = max_cached_tokens
        """Most token ids held in the cache; least recently used pieces are dropped beyond it."""
        if chunk_chars <= 0:
            raise ValueError(f"chunk_chars must be positive, got {chunk_chars}")
        self.chunk_chars = chunk_chars
        """Long pieces are cut at the first space after every ``chunk_chars`` characters (when exact)."""
        self.uncached_reason: str | None = None
        """Why nothing is cached (None when pieces are cached)."""
        self.hit_tokens = 0
        """Token ids served from the cache."""
        self.miss_tokens = 0
        """Token ids the tokenizer computed (pieces not in the cache, and plain encodes)."""
        self._cache: OrderedDict[PieceKey, list[int]] = OrderedDict()
        self._cached_tokens = 0
        self._lock = threading.Lock()
        self._split, self._added_ids, self._unsafe, matched = self._added_token_split()
        # An added token placed before a later piece when tokenizing it alone. None may start a
        # longer added token: the tokenizer matches leftmost-longest, so "<|a|>" + "b..." would
        # otherwise become the token "<|a|>b" where the whole text had something else.
        self._lead = next((c for c in self._added_ids if not any(o != c and o.startswith(c) for o in matched)), "")
        self._frame = self._special_frame()
        self._cut = space_cut_pattern(self.backend) if self._lead else None
        if self.backend.truncation is not None or self.backend.padding is not None:
            self.uncached_reason = "the tokenizer truncates or pads (ids depend on the whole text)"

    # ------------------------------------------------------------ set-up
    def _added_token_split(self):
        """Regex cutting at added tokens (leftmost-longest, like the tokenizer's own matcher)."""
        skip_special = bool(getattr(self.backend, "encode_special_tokens", False))
        split, unsafe, ids, matched = [], [], {}, []
        for token_id, tok in self.backend.get_added_tokens_decoder().items():
            matched.append(tok.content)
            if tok.normalized or (tok.special and skip_special) or not tok.content:
                continue  # matched inside a piece (or not at all): part of the cached piece
            if tok.lstrip or tok.rstrip or tok.single_word:
                unsafe.append(tok.content)
                continue
            split.append(tok.content)
            ids[tok.content] = token_id

        def alternation(contents: list[str]):
            if not contents:
                return None
            return re.compile("(" + "|".join(map(re.escape, sorted(contents, key=len, reverse=True))) + ")")

        return alternation(split), ids, alternation(unsafe), matched

    def _special_frame(self) -> tuple[list[int], list[int]] | None:
        """The ids the post-processor adds before/after one sequence, if the same for every probe."""
        frame = None
        for text in _PROBES:
            bare = self.backend.encode(text, add_special_tokens=False).ids
            full = self.backend.encode(text, add_special_tokens=True).ids
            for start in range(len(full) - len(bare) + 1):
                if full[start:start + len(bare)] == bare:
                    this = (full[:start], full[start + len(bare):])
                    break
            else:
                return None
            if frame is not None and this != frame:
                return None
            frame = this
        return frame

    # ------------------------------------------------------------ encoding
    def encode(self, text: str, add_special_tokens: bool = True,
               max_fresh_chars: int | None = None) -> list[int] | None:
        """Token ids of ``text``, identical to ``tokenizer.encode(text, add_special_tokens=...)``.

        With ``max_fresh_chars``: None (nothing done) when more than that many characters of ``text`` would be
        tokenized afresh rather than come from the cache, so a caller on an event loop can keep cheap (cached)
        work there and send the rest to a thread (replica/openai/renderer.py)."""
        if (self.uncached_reason is not None or (add_special_tokens and self._frame is None)
                or (self._unsafe is not None and self._unsafe.search(text))):
            if max_fresh_chars is not None and len(text) > max_fresh_chars:
                return None
            ids = self.backend.encode(text, add_special_tokens=add_special_tokens).ids
            self.miss_tokens += len(ids)
            return ids
        keys = self._keys(text)
        cache = self._cache
        found: list  # per key: an added token's id (the int key itself), or its piece's cached ids (None: a miss)
        missing: dict | None = None  # a missed piece's key -> its ids once tokenized
        with self._lock:  # held for lookups only: the tokenizer runs outside it (a thread's big miss never
            get = cache.get  # blocks the loop's hits)
            found = [key if isinstance(key, int) else get(key) for key in keys]
            if None in found:
                missing = {key: None for key, got in zip(keys, found, strict=True) if got is None}
                if max_fresh_chars is not None and _chars(missing) > max_fresh_chars:
                    return None
            move, hits = cache.move_to_end, 0
            for key, got in zip(keys, found, strict=True):
                if got is not None and not isinstance(key, int):
                    move(key)
                    hits += len(got)
            self.hit_tokens += hits
        if missing is not None:
            for key in missing:
                missing[key] = self._tokenize(key)
            with self._lock:
                for key, piece_ids in missing.items():
                    self._store(key, piece_ids)
        ids = list(self._frame[0]) if add_special_tokens else []
        for key, got in zip(keys, found, strict=True):
            if key.__class__ is int:
                ids.append(key)
            else:
                ids += got if got is not None else missing[key]
        if add_special_tokens:
            ids += self._frame[1]
        return ids

    def _keys(self, text: str) -> list[int | PieceKey]:
        """``text`` as what ``encode`` concatenates: added token ids (int) and cache keys of pieces (a piece
        at offset 0 of the text as a 1-tuple, any other piece as the str itself)."""
        parts = self._split.split(text) if self._split is not None else [text]
        keys: list[int | PieceKey] = []
        added = self._added_ids
        for i, part in enumerate(parts):
            if i & 1:  # re.split puts the matched added tokens at odd positions
                keys.append(added[part])
            elif len(part) > self.chunk_chars and self._cut is not None:
                chunks = self._chunks(part)
                keys.append((chunks[0],) if i == 0 else chunks[0])
                keys += chunks[1:]
            elif part:
                keys.append((part,) if i == 0 else part)
        return keys

    def _chunks(self, piece: str) -> list[str]:
        """``piece`` cut at the first allowed space at or after every ``chunk_chars`` characters."""
        chunks, start, step, search = [], 0, self.chunk_chars, self._cut.search
        while True:
            found = search(piece, start + step)
            if found is None:
                chunks.append(piece[start:])
                return chunks
            cut = found.start()
            chunks.append(piece[start:cut])
            start = cut

    def _tokenize(self, key: PieceKey) -> list[int]:
        """The ids of a piece (its cache key), from the tokenizer."""
        if isinstance(key, tuple):  # the piece at offset 0 of the text
            ids = self.backend.encode(key[0], add_special_tokens=False).ids
        else:  # behind an added token, as in the whole text (not at offset 0)
            ids = self.backend.encode(self._lead + key, add_special_tokens=False).ids
            assert ids[0] == self._added_ids[self._lead], "an added token must encode to its own id"
            del ids[0]
        self.miss_tokens += len(ids)
        return ids

    def _store(self, key: PieceKey, ids: list[int]) -> None:
        """Cache a piece's ids (under the lock), dropping the least recently used beyond the bound."""
        cache = self._cache
        if len(ids) > self.max_cached_tokens or key in cache:
            return
        cache[key] = ids
        self._cached_tokens += len(ids)
        while self._cached_tokens > self.max_cached_tokens:
            self._cached_tokens -= len(cache.popitem(last=False)[1])

    @property
    def cuts_at_spaces(self) -> bool:
        """Whether long pieces are also cut at spaces (router/routing/tokenize_cuts.py), not only at added tokens."""
        return self._cut is not None

    @property
    def cached_pieces(self) -> int:
        """Pieces in the cache now."""
        return len(self._cache)

    @property
    def cached_tokens(self) -> int:
        """Token ids in the cache now (at most ``max_cached_tokens``)."""
        return self._cached_tokens

