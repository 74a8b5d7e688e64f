"""A replica's KV layout as its ``/load`` advertises it (``kv_transfer.layout``), read at the edge and compared.

    read_layout(raw)                /load's kv_transfer.layout -> (KVLayoutInfo, None) or (None, why it is unusable)
    layout_differences(a, b, ...)   the compared fields that differ, in a receipt's words

Who may share KV with whom, over the replicas' records: router/replicas/kv_share.py.
"""

from __future__ import annotations

import msgspec
from kvmesh.replica.serving.load_report import KVLayoutInfo

COMPARED = ("model", "dtype", "block_size", "scales_digest", "cache_layout", "tp_size", "transport")
"""The layout's fields two replicas must share, in the order a refusal names them."""
MAX_PROBLEM_CHARS = 200
"""A layout problem as logged and put in a receipt is cut to this length."""


def read_layout(raw: object) -> tuple[KVLayoutInfo | None, str | None]:
    """``/load``'s ``kv_transfer.layout`` (a JSON object, or the Struct itself) checked: (the layout, None), or
    (None, why no replica may be paired with it)."""
    if isinstance(raw, KVLayoutInfo):
        return raw, None
    if raw is None:
        return None, "its /load says KV transfer is on but gives no kv_transfer.layout (the KV it holds is unknown)"
    try:
        return msgspec.convert(raw, KVLayoutInfo), None
    except msgspec.ValidationError as e:
        return None, f"its kv_transfer.layout is malformed ({str(e)[:MAX_PROBLEM_CHARS]})"


def layout_differences(theirs: KVLayoutInfo, mine: KVLayoutInfo, their_name: str = "theirs",
                       my_name: str = "mine") -> list[str]:
    """``"field X on theirs vs Y on mine"`` for each compared field that differs (empty: KV moves between them)."""
    t, m = msgspec.structs.asdict(theirs), msgspec.structs.asdict(mine)
    return [f"{name} {t[name] or 'none'} on {their_name} vs {m[name] or 'none'} on {my_name}" for name in COMPARED
            if t[name] != m[name]]
