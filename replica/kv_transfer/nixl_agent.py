"""The NIXL transport: a rank's KV cache registered with a nixl agent (UCX backend), peers read by block id.

As in vLLM's NixlConnector: the whole cache is registered once; every (region, block) of it is one
transfer descriptor, prepared once for this rank ("NIXL_INIT_AGENT") and once per peer from the
peer's layout (its base address and block count); a read is ``make_prepped_xfer("READ", ...)`` with
the descriptor indices of the block ids (layout.py), then ``transfer`` and polling
``check_xfer_state``. UCX moves host memory too, so this runs on CPU; on CUDA the memory type is VRAM.
"""

from __future__ import annotations

import numpy as np
import torch
from kvmesh.replica.kv_transfer.agent import KVHandshake, KVTransferConfig, check_layouts, check_read
from kvmesh.replica.kv_transfer.errors import KVTransferError, KVTransferUnavailable
from kvmesh.replica.kv_transfer.layout import KVBlockLayout

BACKEND = "UCX"


def nixl_missing() -> str | None:
    """Why nixl cannot be used here (None when it can): for callers choosing a transport, and test skips."""
    try:
        import nixl._api  # noqa: F401
    except Exception as e:  # ImportError, or its native libraries failing to load
        return f"nixl is not importable ({type(e).__name__}: {e}); install the engine extra: pip install 'kvmesh[engine]'"
    return None


def _descriptor_array(layout: KVBlockLayout, device_id: int) -> np.ndarray:
    """[num_regions * num_blocks, 3] rows (address, length, device id) in ``layout.descriptor_ids`` order."""
    regions = layout.base_address + np.arange(layout.num_regions, dtype=np.int64) * layout.region_stride
    blocks = np.arange(layout.num_blocks, dtype=np.int64) * layout.block_stride
    rows = np.empty((layout.num_regions * layout.num_blocks, 3), dtype=np.int64)
    rows[:, 0] = (regions[:, None] + blocks[None, :]).reshape(-1)
    rows[:, 1] = layout.block_stride
    rows[:, 2] = device_id
    return rows


def _descriptor_ids(layout: KVBlockLayout, block_ids: list[int]) -> np.ndarray:
    """Indices into ``_descriptor_array`` of ``block_ids``, region-major."""
    regions = np.arange(layout.num_regions, dtype=np.int64)[:, None] * layout.num_blocks
    return (regions + np.asarray(block_ids, dtype=np.int64)[None, :]).reshape(-1)


class NixlTransfer:
    """One READ in flight: its nixl handle, polled by ``agent.wait``."""

    def __init__(self, agent, handle, num_blocks: int) -> None:
        self._agent, self._handle, self.num_blocks = agent, handle, num_blocks

    def state(self) -> str:
        try:
            return self._agent.check_xfer_state(self._handle)
        except Exception:  # nixl raises on a broken connection: the read failed
            return "ERR"

    def release(self) -> None:
        if self._handle is not None:
            try:
                self._agent.release_xfer_handle(self._handle)
            except Exception:  # nixl refuses to release a handle still in flight; the agent's close frees it
                pass
            self._handle = None


class _Peer:
    def __init__(self, layout: KVBlockLayout, dlist) -> None:
        self.layout, self.dlist = layout, dlist


class NixlKVTransferAgent:
    def __init__(self, config: KVTransferConfig, name: str, kv_cache: torch.Tensor, layout: KVBlockLayout) -> None:
        missing = nixl_missing()
        if missing:
            raise KVTransferUnavailable(missing)
        from nixl._api import nixl_agent, nixl_agent_config

        self.config, self.name, self.layout = config, name, layout
        self.mem_type = "VRAM" if kv_cache.is_cuda else "DRAM"
        self.device_id = kv_cache.device.index or 0
        try:
            self._agent = nixl_agent(name, nixl_agent_config(backends=[BACKEND]))
        except Exception as e:
            raise KVTransferUnavailable(f"nixl agent {name!r} could not start its {BACKEND} backend: {e}") from e
        nbytes = kv_cache.numel() * kv_cache.element_size()
        self._registered = self._agent.get_reg_descs([(kv_cache.data_ptr(), nbytes, self.device_id, "")],
                                                     self.mem_type)
        self._agent.register_memory(self._registered)
        self._local = self._agent.prep_xfer_dlist(
            "NIXL_INIT_AGENT", _descriptor_array(layout, self.device_id), self.mem_type)
        self._peers: dict[str, _Peer] = {}
        self._cache = kv_cache  # the registered memory stays alive as long as the agent

    def handshake(self) -> KVHandshake:
        return KVHandshake(self.name, "nixl", self.layout, self._agent.get_agent_metadata(),
                           self.device_id, self.mem_type)

    def add_peer(self, handshake: KVHandshake) -> str:
        if handshake.transport != "nixl":
            raise KVTransferError(f"peer {handshake.agent_name!r} uses the {handshake.transport} transport; "
                                  f"{self.name!r} uses nixl")
        check_layouts(self.layout, handshake, self.name)
        if handshake.agent_name in self._peers:
            self.remove_peer(handshake.agent_name)  # a restarted peer: new addresses
        try:
            peer = self._agent.add_remote_agent(handshake.agent_metadata)
            peer = peer.decode() if isinstance(peer, bytes) else peer
            descriptors = _descriptor_array(handshake.layout, handshake.device_id)
            dlist = self._agent.prep_xfer_dlist(peer, descriptors, handshake.mem_type)
        except Exception as e:
            raise KVTransferError(f"could not connect to KV peer {handshake.agent_name!r}: {e}") from e
        self._peers[peer] = _Peer(handshake.layout, dlist)
        return peer

    def remove_peer(self, peer: str) -> None:
        known = self._peers.pop(peer, None)
        if known is not None:
            self._agent.release_dlist_handle(known.dlist)
            self._agent.remove_remote_agent(peer)

    def start_read(self, peer: str, remote_block_ids: list[int], local_block_ids: list[int]) -> NixlTransfer:
        known = self._peers.get(peer)
        if known is None:
            raise KVTransferError(f"{peer!r} is not a peer of {self.name!r}; add_peer its handshake first")
        check_read(self.layout, known.layout, remote_block_ids, local_block_ids)
        try:
            handle = self._agent.make_prepped_xfer(
                "READ", self._local, _descriptor_ids(self.layout, local_block_ids),
                known.dlist, _descriptor_ids(known.layout, remote_block_ids))
            transfer = NixlTransfer(self._agent, handle, len(local_block_ids))
            if self._agent.transfer(handle) == "ERR":
                transfer.release()
                raise KVTransferError(f"nixl refused to start reading {len(local_block_ids)} KV blocks "
                                      f"from {peer!r}; recompute them")
        except KVTransferError:
            raise
        except Exception as e:
            raise KVTransferError(f"reading {len(local_block_ids)} KV blocks from {peer!r} failed: {e}; "
                                  "recompute them") from e
        return transfer

    def close(self) -> None:
        for peer in list(self._peers):
            self.remove_peer(peer)
        self._agent.release_dlist_handle(self._local)
        self._agent.deregister_memory(self._registered)
