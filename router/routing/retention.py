"""What losing a replica costs in cached reuse: the blocks it holds that no other replica holds.

The autoscaler drains the replica with the smallest cost (``GET /replicas`` reports it as
``exclusive_blocks``): a block another replica also holds is still a cache hit after the drain;
an exclusive one is recomputed on its next use. Predicted blocks (routed, not yet confirmed by
events) are left out on both sides. Reads the index's masks under the router's lock.
"""

from __future__ import annotations

from kvmesh.router.replicas.replica import ReplicaId
from kvmesh.router.routing.kv_router import KVRouter


def exclusive_blocks(router: KVRouter) -> dict[ReplicaId, int]:
    """Per replica: blocks it holds (per its events) that no other replica holds."""
    with router.lock:
        index = router.index
        blocks, predicted = index._blocks, index.predictions.predicted
        trees = [index._replicas[replica_id] for replica_id in index.replica_ids]
        pools = sum(tree.bit for tree in trees)  # the GPU pools' bits (host tiers hold bits of their own)
        out: dict[ReplicaId, int] = {}
        for tree in trees:
            bit = tree.bit
            out[tree.replica_id] = sum(1 for key in set(tree.ext_to_key.values())
                                       if blocks.get(key, 0) & ~predicted.get(key, 0) & pools == bit)
        return out
