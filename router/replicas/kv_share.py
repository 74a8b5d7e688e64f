"""Whether KV can move between two replicas: the layouts their ``/load`` advertises (``kv_transfer.layout``).

A block's hash says which tokens it holds, never how their KV is stored: the KV dtype (FP8 or the model's), the FP8
k/v scales, the attention layout and the tensor-parallel split leave hashes alone (by design), so two replicas of a
fleet halfway through a rollout hold "the same" blocks whose bytes mean different values. A replica's handshake
refuses a peer of another layout (replica/kv_transfer/agent.py); the router compares the same fields first, so it
never plans a pull or a prefill/decode split that the replica would refuse:

    read_layout(raw)        /load's kv_transfer.layout -> (KVLayoutInfo, None) or (None, why it is unusable)
    share_refusal(a, b)     why KV cannot move between replicas a and b; None: it can

A replica with transfer on whose layout is missing, malformed or oversized is paired with no replica (its transfer
counts as off, ``ReplicaLoad.update_transfer``) and the probe logs why. Replicas whose loads were never read from a
``/load`` (the simulator's, built in one process) have no layout and are alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec
from kvmesh.replica.serving.load_report import KVLayoutInfo

if TYPE_CHECKING:
    from kvmesh.router.replicas.replica import Replica

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


def share_refusal(a: Replica, b: Replica) -> str | None:
    """Why KV cannot move between ``a`` and ``b`` (either way), in the words a receipt carries: one advertises an
    unusable layout, or their layouts differ; None otherwise (a replica with transfer off has no layout to compare:
    ``can_pull`` refuses it for that)."""
    for replica in (b, a):
        problem = replica.load.kv_layout_problem
        if problem is not None:
            return f"{replica.id} is paired with no replica: {problem}"
    mine, theirs = a.load.kv_layout, b.load.kv_layout
    differences = layout_differences(theirs, mine, b.id, a.id) if mine is not None and theirs is not None else None
    if differences:
        return f"the KV layout of {b.id} differs from {a.id}'s: {'; '.join(differences)}"
    return None
