"""A tensor-parallel replica's transfer agents, one per rank, driven as one agent from the engine's process.

    engine process (scheduler, block pool, leases)          TPWorker rank r (its own process, its KV shard)
    TPKVTransferAgent ──Ray call per rank──────────────▶    agent "<name>-rank-r" (nixl), cache shard registered
        handshake()   every rank's handshake, rank 0's fields on top (``KVHandshake.ranks``, ``tp_size``)
        add_peer(h)   rank r adds the peer's rank r (the layouts per rank checked there; a different tp is a
                      KVLayoutMismatch here, before anything is sent)
        start_read    rank r reads the peer's rank r blocks: the same block ids on every rank (the block
                      table is shared), each rank's bytes its own heads (num_kv_heads / tp)
        state()       DONE once every rank's read is done; ERR when one failed (``ray.wait``, no waiting)
        abort()       every rank aborts its read (``TPWorker.kv_abort``); each answers once its transport let go

Each rank's read runs inside its worker (``TPWorker.kv_read``: start, then ``agent.wait``: up to the timeout,
then aborted and waited on until its transport confirms it stopped), beside its steps (the worker takes
concurrent calls); the replica's transfer worker thread only checks the rank calls' results. A rank that never
answers keeps the read in flight, so its blocks stay quarantined; a dead rank's memory is gone with it.
Ranks live in separate processes, so the transport is nixl (``local`` works only inside one process).
"""

from __future__ import annotations

import uuid
from typing import Any, Protocol

from kvmesh.events.schema import DEVICE_MEDIUM
from kvmesh.replica.kv_transfer.agent import KVHandshake, KVTransferConfig
from kvmesh.replica.kv_transfer.errors import KVLayoutMismatch, KVTransferError


class TPRanks(Protocol):
    """What the agent needs of a TP replica's runner (worker/tp_executor.py's ``RayTPExecutor`` has it)."""

    world_size: int
    """Ranks in the group."""
    workers: list[Any]
    """Each rank's ``TPWorker`` actor handle, rank order."""
    init_timeout_s: float
    """Longest wait for the ranks to start their agents."""


class TPTransfer:
    """One read per rank; each rank's call returns only once its own read is over (``agent.wait``), so the read
    is in flight (PROC) while any rank's call is unanswered, a rank that cannot answer included."""

    def __init__(self, workers: list, read_id: str, refs: list, num_blocks: int) -> None:
        self._workers, self._read_id, self._refs, self.num_blocks = workers, read_id, refs, num_blocks

    def _answered(self) -> list:
        import ray

        ready, _ = ray.wait(self._refs, num_returns=len(self._refs), timeout=0)
        return ready

    def state(self) -> str:
        if len(self._answered()) < len(self._refs):
            return "PROC"
        return "ERR" if self.failed() else "DONE"

    def failed(self) -> bool:
        """A rank's read failed (KVTransferError there) or its worker died, whether or not the others are over."""
        import ray

        for ref in self._answered():
            try:
                ray.get(ref, timeout=0)
            except Exception:  # noqa: BLE001 - that rank's read failed, or its worker is gone
                return True
        return False

    def abort(self) -> None:
        for worker in self._workers:  # each rank aborts its read and answers once its transport let go
            worker.kv_abort.remote(self._read_id)

    def release(self) -> bool:
        return len(self._answered()) == len(self._refs)  # each rank released its own handle before answering


class TPKVTransferAgent:
    """``KVTransferAgent`` of a RayTPExecutor's replica: one real agent per rank, in its worker."""

    def __init__(self, config: KVTransferConfig, name: str, executor: TPRanks) -> None:
        import ray

        self.config, self.name, self.tp_size = config, name, executor.world_size
        self._workers = list(executor.workers)
        # start-up, not a transfer: each rank loads nixl and starts UCX, so the ranks' start-up timeout applies
        ranks = _get(ray, [w.kv_agent_start.remote(config, f"{name}-rank-{r}") for r, w in enumerate(self._workers)],
                     executor.init_timeout_s, "start the ranks' transfer agents")
        self.layout = ranks[0].layout
        """Rank 0's layout (every rank's is the same: its share of the heads)."""
        first = ranks[0]
        self._handshake = KVHandshake(first.agent_name, first.transport, first.layout, first.agent_metadata,
                                      first.device_id, first.mem_type, tp_size=self.tp_size, ranks=ranks)
        self._peers: dict[str, list[str]] = {}  # peer (its rank 0's name) -> its name on each of our ranks

    def handshake(self) -> KVHandshake:
        return self._handshake

    def add_peer(self, handshake: KVHandshake) -> str:
        import ray

        if handshake.tp_size != self.tp_size:
            raise KVLayoutMismatch(f"peer {handshake.agent_name!r} runs tp (tensor_parallel_size) "
                                   f"{handshake.tp_size}, {self.name!r} runs {self.tp_size}: a pull reads rank r "
                                   "from rank r, so replicas that exchange KV must use the same tensor-parallel size")
        ranks = handshake.rank_handshakes()
        names = _get(ray, [w.kv_add_peer.remote(h) for w, h in zip(self._workers, ranks, strict=True)],
                     self.config.timeout_s, f"add peer {handshake.agent_name!r} on every rank")
        self._peers[names[0]] = names
        return names[0]

    def remove_peer(self, peer: str) -> None:
        import ray

        names = self._peers.pop(peer, None)
        if names is not None:
            try:
                ray.get([w.kv_remove_peer.remote(n) for w, n in zip(self._workers, names, strict=True)],
                        timeout=self.config.timeout_s)
            except Exception:  # noqa: BLE001 - a dead rank forgets its peers anyway
                pass

    def start_read(self, peer: str, remote_block_ids: list[int], local_block_ids: list[int],
                   remote_medium: str = DEVICE_MEDIUM) -> TPTransfer:
        names = self._peers.get(peer)
        if names is None:
            raise KVTransferError(f"{peer!r} is not a peer of {self.name!r}; add_peer its handshake first")
        if len(remote_block_ids) != len(local_block_ids):
            raise ValueError(f"{len(remote_block_ids)} remote block ids but {len(local_block_ids)} local ones; "
                             "a read copies block i of one list into block i of the other")
        self.layout.check_block_ids(local_block_ids, "local")
        read_id = uuid.uuid4().hex
        refs = [w.kv_read.remote(n, remote_block_ids, local_block_ids, remote_medium, read_id)
                for w, n in zip(self._workers, names, strict=True)]
        return TPTransfer(self._workers, read_id, refs, len(local_block_ids))

    def close(self) -> None:
        import ray

        try:
            ray.get([w.kv_close.remote() for w in self._workers], timeout=self.config.timeout_s)
        except Exception:  # noqa: BLE001 - ranks already gone
            pass
        self._peers.clear()


def _get(ray, refs: list, timeout_s: float, what: str) -> list:
    """The ranks' answers; a rank's KVTransferError as itself, anything else as a KVTransferError naming ``what``."""
    try:
        return ray.get(refs, timeout=timeout_s)
    except Exception as e:
        cause = getattr(e, "cause", None) or e  # Ray wraps a rank's exception in a RayTaskError
        if isinstance(cause, KVTransferError):
            raise type(cause)(str(cause)) from None
        raise KVTransferError(f"could not {what}: {type(e).__name__}: {e}") from None
