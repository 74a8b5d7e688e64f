"""Whether KV can move between two replicas: the layouts their ``/load`` advertises (``kv_transfer.layout``).

A block's hash says which tokens it holds, never how their KV is stored: the KV dtype (FP8 or the model's), the FP8
k/v scales, the attention layout and the tensor-parallel split leave hashes alone (by design), so two replicas of a
fleet halfway through a rollout hold "the same" blocks whose bytes mean different values. A replica's handshake
refuses a peer of another layout (replica/kv_transfer/agent.py); the router compares the same fields first, so it
never plans a pull or a prefill/decode split that the replica would refuse:

    share_refusal(a, b)     why KV cannot move between replicas a and b; None: it can

The layout itself, read from ``/load`` and compared field by field: router/replicas/advertised_layout.py.

A replica with transfer on whose layout is missing, malformed or oversized is paired with no replica (its transfer
counts as off, ``ReplicaLoad.update_transfer``) and the probe logs why. Replicas whose loads were never read from a
``/load`` (the simulator's, built in one process) have no layout and are alike.
"""

from __future__ import annotations

from kvmesh.router.replicas.advertised_layout import layout_differences
from kvmesh.router.replicas.replica import Replica


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
