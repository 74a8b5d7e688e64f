"""The NIXL transport: a rank's KV cache registered with a nixl agent (UCX backend), peers read by block id.

As in vLLM's NixlConnector: the whole cache is registered once; every (region, block) of it is one
transfer descriptor, prepared once for this rank ("NIXL_INIT_AGENT") and once per peer from the
peer's layout (its base address and block count); a read is ``make_prepped_xfer("READ", ...)`` with
the descriptor indices of the block ids (layout.py), then ``transfer`` and polling
``check_xfer_state``. UCX moves host memory too, so this runs on CPU; on CUDA the memory type is VRAM.
On host memory UCX copies inside ``transfer`` (nixl's binding lets go of the GIL meanwhile): a serving
engine starts reads on the agent's transfer worker thread (pull_read.py), never on its own.
"""

from __future__ import annotations

import threading

import numpy as np
import torch
from kvmesh.events.schema import DEVICE_MEDIUM, HOST_MEDIUM
from kvmesh.replica.kv_layout import KVBlockLayout, host_tier_layout
from kvmesh.replica.kv_transfer.agent import KVHandshake, KVTransferConfig, check_layouts, check_read
from kvmesh.replica.kv_transfer.errors import KVTransferError, KVTransferUnavailable

BACKEND = "UCX"
_construct_lock = threading.Lock()


def nixl_missing() -> str | None:
    """Why nixl cannot be used here (None when it can): for callers choosing a transport, and test skips."""
    try:
        import nixl._api  # noqa: F401
    except Exception as e:  # ImportError, or its native libraries failing to load
        return (f"nixl is not importable ({type(e).__name__}: {e}); install the engine extra: "
                "pip install '.[engine]' in kvmesh's source tree")
    return None


def _descriptor_array(layout: KVBlockLayout, device_id: int) -> np.ndarray:
    """[num_regions * num_blocks, 3] rows (address, length, device id) in ``layout.descriptor_ids`` order."""
    regions = layout.base_address + np.arange(layout.num_regions, dtype=np.int64) * layout.region_stride
    blocks = np.arange(layout.num_blocks, dtype=np.int64) * layout.block_pitch
    rows = np.empty((layout.num_regions * layout.num_blocks, 3), dtype=np.int64)
    rows[:, 0] = (regions[:, None] + blocks[None, :]).reshape(-1)
    rows[:, 1] = layout.block_stride
    rows[:, 2] = device_id
    return rows


def _descriptor_ids(layout: KVBlockLayout, block_ids: list[int]) -> np.ndarray:
    """Indices into ``_descriptor_array`` of ``block_ids``, region-major."""
    regions = np.arange(layout.num_regions, dtype=np.int64)[:, None] * layout.num_blocks
    return (regions + np.asarray(block_ids, dtype=np.int64)[None, :]).reshape(-1)


def _start_agent(name: str, progress_delay_us: int):
    """A ``nixl_agent`` on the UCX backend whose progress thread sleeps ``progress_delay_us`` in poll() between
    wake-ups (it still wakes at once on its workers' event fds: large reads got faster on 2 cores, a one-block read
    ~0.05 ms slower; BENCHMARKS.md, "KV transfer between replicas").

    nixl's Python wrapper builds its native config itself and fixes ``pthrDelay`` at 0, which has the thread
    busy-poll a core per agent, idle or not; the config class it builds is swapped, for this constructor only,
    for one that takes ``progress_delay_us`` instead.
    """
    from nixl import _api

    bindings = _api.nixlBind
    native_config = bindings.nixlAgentConfig

    class PatientConfig(native_config):
        def __setattr__(self, key, value):
            if key == "pthrDelay":
                value = progress_delay_us
            super().__setattr__(key, value)

    with _construct_lock:
        bindings.nixlAgentConfig = PatientConfig
        try:
            return _api.nixl_agent(name, _api.nixl_agent_config(backends=[BACKEND]))
        finally:
            bindings.nixlAgentConfig = native_config


class NixlTransfer:
    """One READ posted to nixl. Over once nixl reports DONE or ERR and lets its handle go: nixl refuses to release a
    handle still in flight (it tries to cancel it first), so a refusal keeps the handle, and the caller asks again
    later; the local blocks stay held meanwhile."""

    def __init__(self, agent, lock: threading.RLock, handle, num_blocks: int, posted: str = "PROC") -> None:
        self._agent, self._lock, self._handle, self.num_blocks = agent, lock, handle, num_blocks
        self._last = "ERR" if posted == "ERR" else "PROC"
        """The last state nixl reported (``transfer`` said ERR: the post failed)."""

    def state(self) -> str:
        if self._handle is None:
            return self._last
        if self._last != "ERR":
            try:
                with self._lock:
                    self._last = self._agent.check_xfer_state(self._handle)
            except Exception:  # nixl raises on a broken connection: the read failed
                self._last = "ERR"
        return self._last

    def abort(self) -> None:
        self.release()  # nixl cancels a read in flight on release when it can; refused: it keeps running

    def release(self) -> bool:
        if self._handle is None:
            return True
        try:
            with self._lock:
                self._agent.release_xfer_handle(self._handle)
        except Exception:  # nixl refuses to release a handle still in flight: it may still write; ask again later
            return False
        self._handle = None
        if self._last == "PROC":  # released in flight: nixl cancelled it
            self._last = "ERR"
        return True


class _Peer:
    """A peer's tiers: medium -> (its layout, its prepared descriptor list)."""

    def __init__(self, tiers: dict[str, tuple[KVBlockLayout, object]]) -> None:
        self.tiers = tiers


class NixlKVTransferAgent:
    """One rank's nixl agent. Its calls come from two threads (handshakes on the replica's HTTP loop, reads on
    the agent's transfer worker thread) and the agent runs without nixl's own locking (``NIXL_THREAD_SYNC_NONE``,
    the default without a listener thread), so every call into it holds ``_lock``."""

    tp_size = 1  # one rank's agent (tp_agent.py reads on every rank)

    def __init__(self, config: KVTransferConfig, name: str, kv_cache: torch.Tensor, layout: KVBlockLayout,
                 host_cache: torch.Tensor | None = None) -> None:
        missing = nixl_missing()
        if missing:
            raise KVTransferUnavailable(missing)

        self.config, self.name, self.layout = config, name, layout
        self.mem_type = "VRAM" if kv_cache.is_cuda else "DRAM"
        self.device_id = kv_cache.device.index or 0
        self._lock = threading.RLock()
        try:
            self._agent = _start_agent(name, config.progress_delay_us)
        except Exception as e:
            raise KVTransferUnavailable(f"nixl agent {name!r} could not start its {BACKEND} backend: {e}") from e
        nbytes = kv_cache.numel() * kv_cache.element_size()
        self._registered = [self._agent.get_reg_descs([(kv_cache.data_ptr(), nbytes, self.device_id, "")],
                                                      self.mem_type)]
        self.host_layout = None  # the host tier (medium "CPU", DRAM), registered too: peers read it by block id
        if host_cache is not None:
            self.host_layout = host_tier_layout(layout, host_cache)
            self._registered.append(self._agent.get_reg_descs(
                [(host_cache.data_ptr(), host_cache.numel() * host_cache.element_size(), 0, "")], "DRAM"))
        for registered in self._registered:
            self._agent.register_memory(registered)
        self._local = self._agent.prep_xfer_dlist(
            "NIXL_INIT_AGENT", _descriptor_array(layout, self.device_id), self.mem_type)
        self._peers: dict[str, _Peer] = {}
        self._cache = (kv_cache, host_cache)  # the registered memory stays alive as long as the agent

    def handshake(self) -> KVHandshake:
        with self._lock:
            metadata = self._agent.get_agent_metadata()
        return KVHandshake(self.name, "nixl", self.layout, metadata,
                           self.device_id, self.mem_type, host_layout=self.host_layout)

    def add_peer(self, handshake: KVHandshake) -> str:
        if handshake.transport != "nixl":
            raise KVTransferError(f"peer {handshake.agent_name!r} uses the {handshake.transport} transport; "
                                  f"{self.name!r} uses nixl")
        check_layouts(self.layout, handshake, self.name)
        with self._lock:
            return self._add_peer(handshake)

    def _add_peer(self, handshake: KVHandshake) -> str:
        if handshake.agent_name in self._peers:
            self.remove_peer(handshake.agent_name)  # a restarted peer: new addresses
        try:
            peer = self._agent.add_remote_agent(handshake.agent_metadata)
            peer = peer.decode() if isinstance(peer, bytes) else peer
            tiers = {DEVICE_MEDIUM: (handshake.layout, self._agent.prep_xfer_dlist(
                peer, _descriptor_array(handshake.layout, handshake.device_id), handshake.mem_type))}
            if handshake.host_layout is not None:
                tiers[HOST_MEDIUM] = (handshake.host_layout, self._agent.prep_xfer_dlist(
                    peer, _descriptor_array(handshake.host_layout, 0), "DRAM"))
        except Exception as e:
            raise KVTransferError(f"could not connect to KV peer {handshake.agent_name!r}: {e}") from e
        self._peers[peer] = _Peer(tiers)
        return peer

    def remove_peer(self, peer: str) -> None:
        with self._lock:
            known = self._peers.pop(peer, None)
            if known is not None:
                for _, dlist in known.tiers.values():
                    self._agent.release_dlist_handle(dlist)
                self._agent.remove_remote_agent(peer)

    def start_read(self, peer: str, remote_block_ids: list[int], local_block_ids: list[int],
                   remote_medium: str = DEVICE_MEDIUM) -> NixlTransfer:
        known = self._peers.get(peer)
        if known is None:
            raise KVTransferError(f"{peer!r} is not a peer of {self.name!r}; add_peer its handshake first")
        if remote_medium not in known.tiers:
            raise KVTransferError(f"peer {peer!r} has no {remote_medium!r} tier to read from")
        remote_layout, remote_dlist = known.tiers[remote_medium]
        check_read(self.layout, remote_layout, remote_block_ids, local_block_ids)
        try:
            with self._lock:
                handle = self._agent.make_prepped_xfer(
                    "READ", self._local, _descriptor_ids(self.layout, local_block_ids),
                    remote_dlist, _descriptor_ids(remote_layout, remote_block_ids))
        except Exception as e:  # nothing posted yet
            raise KVTransferError(f"reading {len(local_block_ids)} KV blocks from {peer!r} failed: {e}; "
                                  "recompute them") from e
        try:  # posted from here on: returned whatever happens, so the caller waits until nixl lets it go
            with self._lock:
                started = self._agent.transfer(handle)
        except Exception:  # noqa: BLE001 - a failed post reads as ERR
            started = "ERR"
        return NixlTransfer(self._agent, self._lock, handle, len(local_block_ids), started)

    def close(self) -> None:
        with self._lock:
            for peer in list(self._peers):
                self.remove_peer(peer)
            self._agent.release_dlist_handle(self._local)
            for registered in self._registered:
                self._agent.deregister_memory(registered)
