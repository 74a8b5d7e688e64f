"""Refuse a payload by its shape before decoding it: msgpack headers peeked, nothing built.

A decode costs what the payload makes it cost: 4 MB of arrays nested where events belong build 2M
Python lists (~1.4 s, ~300 MB), 200,000 positional events ~0.6 s -- before any limit on the decoded
batch could say no. A batch is ``[ts, events, dp_rank]``, each event a map (or, older vLLM, an
array ``[type, ...]``) of scalars and lists of scalars; only ``extra_keys`` nests one level deeper (one
entry per block, each a short tuple). ``peek_batch`` reads the headers and refuses, with ``DecodeError``:

- a payload that is not an array of 2-3 elements starting with a number;
- more than ``max_events`` events (read from the events array's header: O(1));
- containers nested deeper than a batch has them (``MAX_DEPTH``), an event that is neither a map nor
  ``[type, ...]``, a container inside ``block_hashes`` or ``token_ids``, more fields than an event has,
  ``extra_keys`` with more entries than ``max_blocks`` or longer entries than ``MAX_EXTRA_KEY_ITEMS``.

The walk reads the first ``budget`` items only (``PEEK_ITEMS``: ~1 ms; a valid batch of 65,536 blocks
has 1.1M), except where the typed decoder itself would build what the payload nests: every
``extra_keys`` (the schema's one ``Any``) is checked whole, found by a skip-only typed decode (C speed,
nothing allocated beyond one slice per event). ``check_shape`` walks everything, for the lenient decoder
(codec.py), which otherwise builds whatever it is given.
"""

from __future__ import annotations

import msgspec

MAX_DEPTH = 6
"""Nesting of a valid batch: batch > events > event > extra_keys > entry > key."""
MAX_EVENT_FIELDS = 32
"""Most fields (map entries or array elements) of one event; vLLM's BlockStored has 15."""
MAX_EXTRA_KEY_ITEMS = 16
"""Most items of one block's ``extra_keys`` entry (vLLM: LoRA name, cache salt, multimodal hashes)."""
PEEK_ITEMS = 4096
"""Items ``peek_batch`` walks before it trusts the typed decoder with the rest."""
_SCALAR_LISTS = (b"block_hashes", b"token_ids", b"lookahead_token_ids")
_EXTRA_KEYS = b"extra_keys"


class ShapeError(ValueError):
    """The payload's shape is not a batch's (raised inside the walk; ``DecodeError`` outside)."""


class _ExtraKeysOnly(msgspec.Struct):
    """One map event with only its ``extra_keys`` kept, raw (every other field is skipped unread)."""

    extra_keys: msgspec.Raw = msgspec.Raw(b"\xc0")  # nil when absent


_EXTRA_DECODER = msgspec.msgpack.Decoder(tuple[float, list[_ExtraKeysOnly], int | None])
_EXTRA_DECODER_2 = msgspec.msgpack.Decoder(tuple[float, list[_ExtraKeysOnly]])

# msgpack first bytes -> (kind, fixed size after the first byte); kinds: "s" scalar, "str"/"bin"/"ext"
# with a length of n bytes, "a"/"m" container with a length of n bytes (fix* forms are decoded inline).
_FIXED = {0xC0: 0, 0xC2: 0, 0xC3: 0, 0xCA: 4, 0xCB: 8, 0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8,
          0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8, 0xD4: 2, 0xD5: 3, 0xD6: 5, 0xD7: 9, 0xD8: 17}
_SIZED = {0xC4: 1, 0xC5: 2, 0xC6: 4, 0xD9: 1, 0xDA: 2, 0xDB: 4}  # bin8/16/32, str8/16/32: length bytes
_EXT = {0xC7: 1, 0xC8: 2, 0xC9: 4}
_ARRAY = {0xDC: 2, 0xDD: 4}
_MAP = {0xDE: 2, 0xDF: 4}
_NUMBER = frozenset(range(0x00, 0x80)) | frozenset(range(0xE0, 0x100)) | frozenset(
    {0xCA, 0xCB, 0xCC, 0xCD, 0xCE, 0xCF, 0xD0, 0xD1, 0xD2, 0xD3})


class _Walker:
    """Reads msgpack headers of ``buf`` from a position, skipping scalar bodies; ``items`` counts down."""

    __slots__ = ("buf", "pos", "items", "max_blocks")

    def __init__(self, buf: bytes, pos: int, items: float, max_blocks: int) -> None:
        self.buf, self.pos, self.items, self.max_blocks = buf, pos, items, max_blocks

    def _uint(self, n: int) -> int:
        end = self.pos + n
        if end > len(self.buf):
            raise ShapeError("payload ends inside a header")
        value = int.from_bytes(self.buf[self.pos:end], "big")
        self.pos = end
        return value

    def header(self) -> tuple[str, int]:
        """The next item's kind ("a" array, "m" map, "str", "s" other scalar) and, for a container, its
        length; a scalar's body is skipped."""
        if self.pos >= len(self.buf):
            raise ShapeError("payload ends early")
        b = self.buf[self.pos]
        self.pos += 1
        self.items -= 1
        if b <= 0x7F or b >= 0xE0:
            return "s", 0
        if 0x90 <= b <= 0x9F:
            return "a", b & 0x0F
        if 0x80 <= b <= 0x8F:
            return "m", b & 0x0F
        if 0xA0 <= b <= 0xBF:
            self.pos += b & 0x1F
            return "str", 0
        if b in _FIXED:
            self.pos += _FIXED[b]
            return "s", 0
        if b in _SIZED:
            size = self._uint(_SIZED[b])  # (not `pos += _uint()`: that reads pos before _uint moves it)
            self.pos += size
            return ("str" if b >= 0xD9 else "s"), 0
        if b in _EXT:
            size = self._uint(_EXT[b])
            self.pos += size + 1
            return "s", 0
        if b in _ARRAY:
            return "a", self._uint(_ARRAY[b])
        if b in _MAP:
            return "m", self._uint(_MAP[b])
        raise ShapeError(f"byte 0x{b:02x} is not msgpack")

    def key(self) -> bytes | None:
        """The next map key if it is a short string (its bytes), else None (skipped)."""
        start, b = self.pos, self.buf[self.pos] if self.pos < len(self.buf) else -1
        kind, n = self.header()
        if kind in ("a", "m"):
            raise ShapeError("a container used as a map key")
        return bytes(self.buf[start + 1:self.pos]) if 0xA0 <= b <= 0xBF else None

    def value(self, depth: int) -> None:
        """Walk one item at nesting ``depth`` (the batch is 1) and everything in it, within budget."""
        if self.items <= 0:
            raise StopIteration
        kind, n = self.header()
        if kind in ("s", "str"):
            return
        if depth >= MAX_DEPTH:
            raise ShapeError(f"containers nested deeper than a batch's {MAX_DEPTH} levels")
        for _ in range(2 * n if kind == "m" else n):
            self.value(depth + 1)

    def scalars(self, what: str) -> None:
        """A list whose elements must be scalars (block hashes, token ids)."""
        kind, n = self.header()
        if kind == "m":
            raise ShapeError(f"{what} is a map; expected a list")
        for _ in range(n):
            if self.items <= 0:
                raise StopIteration
            if self.header()[0] in ("a", "m"):
                raise ShapeError(f"a container inside {what}; expected numbers or bytes")

    def event(self) -> None:
        kind, n = self.header()
        if kind not in ("a", "m"):
            raise ShapeError("an event that is neither a map nor [type, ...]")
        if n > MAX_EVENT_FIELDS:
            raise ShapeError(f"an event with {n} fields; an event has at most {MAX_EVENT_FIELDS}")
        if kind == "a":
            if n and self.header()[0] != "str":
                raise ShapeError("an array event whose first element is not its type name")
            for _ in range(n - 1):
                self.value(4)
            return
        for _ in range(n):
            key = self.key()
            if key in _SCALAR_LISTS:
                self.scalars(key.decode())
            elif key == _EXTRA_KEYS:
                self.extra_keys()
            else:
                self.value(4)

    def extra_keys(self) -> None:
        """``extra_keys``: None or one entry per block, each None or a short list of keys (a key: a
        scalar or a short list of scalars)."""
        kind, n = self.header()
        if kind != "a":
            return  # None (or another scalar: the decoder's problem)
        if n > self.max_blocks:
            raise ShapeError(f"extra_keys with {n} entries; a batch names at most {self.max_blocks} blocks")
        for _ in range(n):
            kind, m = self.header()
            if kind == "m" or (kind == "a" and m > MAX_EXTRA_KEY_ITEMS):
                raise ShapeError(f"an extra_keys entry of {m} items; expected at most {MAX_EXTRA_KEY_ITEMS}")
            for _ in range(m):
                kind, k = self.header()
                if kind == "m" or (kind == "a" and k > MAX_EXTRA_KEY_ITEMS):
                    raise ShapeError("an extra key nested deeper than a short list of scalars")
                for _ in range(k):
                    if self.header()[0] in ("a", "m"):
                        raise ShapeError("an extra key nested deeper than a short list of scalars")


def _walk(payload: bytes, max_events: int, max_blocks: int, budget: float) -> None:
    """Header checks + the walk of up to ``budget`` items."""
    w = _Walker(payload, 0, budget, max_blocks)
    kind, n = w.header()
    if kind != "a" or n not in (2, 3):
        raise ShapeError(f"payload is {'an array of ' + str(n) if kind == 'a' else 'not an array'}; "
                         "expected [ts, events, dp_rank]")
    if w.pos >= len(payload) or payload[w.pos] not in _NUMBER:
        raise ShapeError("the batch's ts is not a number")
    w.header()
    kind, events = w.header()
    if kind != "a":
        raise ShapeError("the batch's events are not an array")
    if events > max_events:
        raise ShapeError(f"a batch of {events} events; the limit is max_batch_events={max_events}")
    try:
        for _ in range(events):
            w.event()
    except StopIteration:
        pass


def peek_batch(payload: bytes, max_events: int, max_blocks: int) -> None:
    """Raise ``ShapeError`` unless ``payload`` is shaped like a batch (see the module doc): the headers,
    the first ``PEEK_ITEMS`` items, and every ``extra_keys``."""
    _walk(payload, max_events, max_blocks, PEEK_ITEMS)
    if _EXTRA_KEYS not in payload:
        return
    try:
        decoded = (_EXTRA_DECODER if payload[0] == 0x93 else _EXTRA_DECODER_2).decode(payload)
    except (msgspec.MsgspecError, RecursionError, ValueError):
        # Not all map events: the typed decoder would still build the extra_keys of those before the
        # first that is not, so look at everything.
        check_shape(payload, max_events, max_blocks)
        return
    for event in decoded[1]:
        _Walker(bytes(event.extra_keys), 0, float("inf"), max_blocks).extra_keys()


def check_shape(payload: bytes, max_events: int, max_blocks: int) -> None:
    """Raise ``ShapeError`` unless every item of ``payload`` is where a batch has one (a whole walk)."""
    _walk(payload, max_events, max_blocks, float("inf"))
