"""The server-sent events of a replica's stream as the router reads them (stream migration: migration.py): a byte
stream cut into whole events, and the fields found in an event's bytes without decoding it (its token ids, the
prompt's, its finish reason, a chunk that carries no text).
"""

from __future__ import annotations

import re

DATA, DONE = b"data: ", b"data: [DONE]"
TOKEN_IDS = re.compile(rb',\s*"token_ids"\s*:\s*\[([\d,\s]*)\]')
PROMPT_IDS = re.compile(rb',\s*"prompt_token_ids"\s*:\s*\[([\d,\s]*)\]')
FINISH = re.compile(rb'"finish_reason"\s*:\s*"(\w+)"')
SSE_FIELDS = (b":", b"event:", b"id:", b"retry:")
"""How an SSE event that carries no data may begin (a comment, or one of the other fields)."""
NO_TEXT = re.compile(rb'"delta"\s*:\s*\{\s*"content"\s*:\s*""\s*\}|"text"\s*:\s*""')
"""A chunk without text: a replica sends one per token that adds none (for its token ids)."""
# A JSON string cannot hold an unescaped quote, so these patterns only ever match the real fields.


def id_list(raw: bytes) -> list[int]:
    """The ids of a matched ``[...]`` list's inside (``TOKEN_IDS``/``PROMPT_IDS`` group 1)."""
    return [int(x) for x in raw.split(b",") if x.strip()]


class SseSplitter:
    """Cuts a byte stream into whole server-sent events (returned without their blank-line terminator)."""

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[bytes]:
        *events, self._buf = (self._buf + data).split(b"\n\n")
        return events
