"""The in-process transport: agents in one process read each other's caches with tensor copies.

For tests and tools that run without nixl: same interface, same checks (layouts at the handshake,
block ids before a read), same result (the bytes of the peer's blocks in the local ones). Agents
find each other by name in a process-wide table; a closed agent is gone, so reading from it fails
as a dead peer does.
"""

from __future__ import annotations

import torch
from kvmesh.events.schema import DEVICE_MEDIUM, HOST_MEDIUM
from kvmesh.replica.kv_layout import KVBlockLayout, host_tier_layout
from kvmesh.replica.kv_transfer.agent import (
    KVHandshake,
    KVTransferConfig,
    check_layouts,
    check_read,
    peer_layout,
)
from kvmesh.replica.kv_transfer.errors import KVTransferError

_LIVE: dict[str, LocalKVTransferAgent] = {}


def _blocks_view(kv_cache: torch.Tensor, layout: KVBlockLayout) -> torch.Tensor:
    """``kv_cache`` as [num_regions, num_blocks, elements per region of a block]."""
    return kv_cache.view(layout.num_regions, layout.num_blocks, -1)


def _host_view(host_cache: torch.Tensor, layout: KVBlockLayout) -> torch.Tensor:
    """A host tier [num_host_blocks, *one block] as [num_regions, num_host_blocks, elements per region]."""
    return host_cache.view(host_cache.shape[0], layout.num_regions, -1).transpose(0, 1)


class DoneTransfer:
    """A local read completes inside ``start_read``."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks

    def state(self) -> str:
        return "DONE"

    def abort(self) -> None:
        pass

    def release(self) -> bool:
        return True


class LocalKVTransferAgent:
    tp_size = 1  # one rank's agent
    def __init__(self, config: KVTransferConfig, name: str, kv_cache: torch.Tensor, layout: KVBlockLayout,
                 host_cache: torch.Tensor | None = None) -> None:
        if name in _LIVE:
            raise ValueError(f"a local KV transfer agent named {name!r} already exists in this process")
        self.config, self.name, self.layout = config, name, layout
        self._cache = _blocks_view(kv_cache, layout)
        self.host_layout = None if host_cache is None else host_tier_layout(layout, host_cache)
        self._tiers = {DEVICE_MEDIUM: self._cache}
        if host_cache is not None:
            self._tiers[HOST_MEDIUM] = _host_view(host_cache, layout)
        self._peers: dict[str, KVHandshake] = {}
        _LIVE[name] = self

    def handshake(self) -> KVHandshake:
        return KVHandshake(self.name, "local", self.layout, host_layout=self.host_layout)

    def add_peer(self, handshake: KVHandshake) -> str:
        if handshake.transport != "local":
            raise KVTransferError(f"peer {handshake.agent_name!r} uses the {handshake.transport} transport; "
                                  f"{self.name!r} uses local")
        check_layouts(self.layout, handshake, self.name)
        self._peers[handshake.agent_name] = handshake
        return handshake.agent_name

    def remove_peer(self, peer: str) -> None:
        self._peers.pop(peer, None)

    def start_read(self, peer: str, remote_block_ids: list[int], local_block_ids: list[int],
                   remote_medium: str = DEVICE_MEDIUM) -> DoneTransfer:
        if peer not in self._peers:
            raise KVTransferError(f"{peer!r} is not a peer of {self.name!r}; add_peer its handshake first")
        check_read(self.layout, peer_layout(self._peers[peer], remote_medium), remote_block_ids, local_block_ids)
        holder = _LIVE.get(peer)
        if holder is None:
            raise KVTransferError(f"peer {peer!r} is gone (its agent was closed); recompute the blocks")
        source = holder._tiers[remote_medium]
        index = torch.tensor(remote_block_ids, dtype=torch.long, device=source.device)
        rows = source.index_select(1, index).to(self._cache.device)
        self._cache[:, torch.tensor(local_block_ids, dtype=torch.long, device=self._cache.device)] = rows
        return DoneTransfer(len(local_block_ids))

    def close(self) -> None:
        if _LIVE.get(self.name) is self:
            del _LIVE[self.name]
        self._peers.clear()
