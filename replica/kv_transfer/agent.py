"""The KV transfer agent of one replica rank: its interface, its handshake message, and the registry.

    a = make_kv_transfer_agent(config, "replica-0-rank-0", kv_cache, layout)   # registers the cache
    b = make_kv_transfer_agent(config, "replica-1-rank-0", other_cache, other_layout)
    peer = b.add_peer(a.handshake())             # layouts checked here: KVLayoutMismatch names the fields
    b.read_blocks(peer, remote_block_ids=[7, 8], local_block_ids=[3, 4])   # a's blocks 7, 8 -> b's 3, 4

The handshake travels out of band (an HTTP call, a Ray call, a pipe in tests) as msgpack
(``encode_handshake`` / ``decode_handshake``). A read is one-sided, like vLLM's NixlConnector: the
reader pulls, the holder's engine is not involved. ``start_read`` posts the read (nixl may copy inside it on
host memory: a serving engine calls it on a transfer worker thread, pull_read.py) and ``wait`` polls until it
is over, raising ``KVTransferError`` on ERR and ``KVTransferTimeout`` past the timeout, after aborting the
read and waiting for the transport to confirm it stopped: a failed read never lands late in reused blocks. Transports:
``nixl`` (UCX; host or device memory, across
processes and machines) and ``local`` (the same process, plain tensor copies: for tests without nixl).
"""

from __future__ import annotations

import importlib
import threading
import time
from typing import Protocol, runtime_checkable

import msgspec
import torch
from kvmesh.events.schema import DEVICE_MEDIUM, HOST_MEDIUM
from kvmesh.replica.kv_layout import KVBlockLayout
from kvmesh.replica.kv_transfer.config import KVTransferConfig  # noqa: F401 - re-exported
from kvmesh.replica.kv_transfer.errors import KVLayoutMismatch, KVTransferError, KVTransferTimeout

# name -> "module:Class", imported on first use (nixl loads large native libraries).
_TRANSPORTS = {
    "nixl": "kvmesh.replica.kv_transfer.nixl_agent:NixlKVTransferAgent",
    "local": "kvmesh.replica.kv_transfer.local_agent:LocalKVTransferAgent",
}


class KVHandshake(msgspec.Struct, frozen=True):
    """What a rank sends a peer so the peer can read its blocks."""

    agent_name: str
    transport: str
    layout: KVBlockLayout
    agent_metadata: bytes = b""
    """The transport's own connection data (nixl's ``get_agent_metadata``)."""
    device_id: int = 0
    """The device the cache lives on (CUDA index; 0 for host memory)."""
    mem_type: str = "DRAM"
    """nixl's memory type of the cache: ``DRAM`` (host) or ``VRAM`` (GPU)."""
    tp_size: int = 1
    """Tensor-parallel ranks of the replica; the fields above are rank 0's."""
    ranks: list[KVHandshake] = []
    """Every rank's own handshake in rank order when ``tp_size`` > 1 (a pull reads rank r from rank r)."""
    host_layout: KVBlockLayout | None = None
    """The host tier's blocks (medium ``"CPU"``, host memory) when the replica has one: a lease may name blocks
    that live only there (``layout`` is the device tier's, medium ``"GPU"``)."""

    def rank_handshakes(self) -> list[KVHandshake]:
        """One handshake per tensor-parallel rank (this one alone for a single-rank replica)."""
        return list(self.ranks) if self.ranks else [self]


_encoder, _decoder = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(KVHandshake)


def encode_handshake(handshake: KVHandshake) -> bytes:
    return _encoder.encode(handshake)


def decode_handshake(raw: bytes) -> KVHandshake:
    return _decoder.decode(raw)


@runtime_checkable
class KVTransfer(Protocol):
    """One started read. It is over (nothing more can land in its local blocks) only once ``state`` is not
    ``"PROC"`` and ``release`` returned True; until then the local blocks must stay held."""

    num_blocks: int

    def state(self) -> str:
        """``"PROC"`` while the transport may still write into the local blocks (an aborted read too, until the
        transport confirms it stopped), then ``"DONE"`` or ``"ERR"``."""

    def abort(self) -> None:
        """Ask the transport to stop the read (giving up on it); never waits. ``state`` keeps saying ``"PROC"``
        until the transport confirms it stopped."""

    def release(self) -> bool:
        """Free the transport's handle: True once freed (and on every later call); False when the transport
        refuses because the read is still in flight (nixl does): keep it and ask again later."""


@runtime_checkable
class KVTransferAgent(Protocol):
    name: str
    layout: KVBlockLayout
    """Rank 0's layout (every rank's is the same but for its addresses and block count)."""
    config: KVTransferConfig
    tp_size: int
    """Tensor-parallel ranks the agent reads on (1 for one rank's agent)."""

    def handshake(self) -> KVHandshake:
        """This rank's handshake, for a peer's ``add_peer``."""

    def add_peer(self, handshake: KVHandshake) -> str:
        """Connect to the peer that sent ``handshake`` and return its name; KVLayoutMismatch when its layout
        differs from this rank's."""

    def remove_peer(self, peer: str) -> None:
        """Forget a peer (it left, or died)."""

    def start_read(self, peer: str, remote_block_ids: list[int], local_block_ids: list[int],
                   remote_medium: str = DEVICE_MEDIUM) -> KVTransfer:
        """Start copying the peer's ``remote_block_ids`` into this rank's ``local_block_ids`` (same length);
        ``remote_medium`` ``"CPU"`` reads them from the peer's host tier."""

    def close(self) -> None:
        """Deregister the cache and drop every peer."""


def wait(agent: KVTransferAgent, transfer: KVTransfer, peer: str, timeout_s: float | None = None,
         abort: threading.Event | None = None) -> None:
    """Poll ``transfer`` until it is over; return on DONE, KVTransferError on ERR. Past ``timeout_s`` (the agent's
    ``config.timeout_s`` by default), or once ``abort`` is set, the read is aborted and still waited on until the
    transport confirms it stopped, then KVTransferTimeout: on return or raise, nothing more lands in the local
    blocks (the transfer's handle is released)."""
    timeout_s = agent.config.timeout_s if timeout_s is None else timeout_s
    deadline = time.monotonic() + timeout_s
    given_up: KVTransferError | None = None
    while True:
        state = transfer.state()
        if state != "PROC" and transfer.release():
            break
        if given_up is None and (time.monotonic() > deadline or (abort is not None and abort.is_set())):
            given_up = KVTransferTimeout(f"reading {transfer.num_blocks} KV blocks from {peer!r} did not finish "
                                         f"within {timeout_s:g} s (peer dead or stalled, or given up); recompute them")
            transfer.abort()
        time.sleep(agent.config.poll_interval_s)
    if given_up is not None:
        raise given_up
    if state != "DONE":
        raise KVTransferError(f"reading {transfer.num_blocks} KV blocks from {peer!r} failed "
                              f"(transfer state {state}); recompute them")


def read_blocks(agent: KVTransferAgent, peer: str, remote_block_ids: list[int], local_block_ids: list[int],
                timeout_s: float | None = None) -> None:
    """Copy the peer's blocks into this rank's and return once they are here (``start_read`` + ``wait``)."""
    wait(agent, agent.start_read(peer, remote_block_ids, local_block_ids), peer, timeout_s)


def check_read(layout: KVBlockLayout, remote: KVBlockLayout, remote_block_ids: list[int],
               local_block_ids: list[int]) -> None:
    """The arguments of a read, checked before anything moves (every transport calls this)."""
    if len(remote_block_ids) != len(local_block_ids):
        raise ValueError(f"{len(remote_block_ids)} remote block ids but {len(local_block_ids)} local ones; "
                         "a read copies block i of one list into block i of the other")
    remote.check_block_ids(remote_block_ids, "remote")
    layout.check_block_ids(local_block_ids, "local")


def check_layouts(mine: KVBlockLayout, handshake: KVHandshake, my_name: str, tp_size: int = 1) -> None:
    """KVLayoutMismatch naming every field where the peer's layout (and tensor-parallel size) differs from this
    rank's: its dtype, its FP8 scales' digest, its shape."""
    differences = mine.mismatch(handshake.layout)
    if handshake.tp_size != tp_size:
        differences.insert(0, f"tp (tensor_parallel_size): {tp_size} vs {handshake.tp_size}")
    theirs = handshake.layout
    if mine.dtype == theirs.dtype and mine.scales_digest != theirs.scales_digest:  # same FP8 format, other scales
        differences.insert(0, f"FP8 KV scales digest {mine.scales_digest or 'none'} on {my_name!r} vs "
                              f"{theirs.scales_digest or 'none'} on {handshake.agent_name!r} (their caches quantize "
                              "with other k/v scales: load the same checkpoint's scales on both)")
    if mine.dtype != theirs.dtype:  # the one a user sets per replica (kv_cache_dtype): said first
        differences.insert(0, f"KV cache dtype {mine.dtype} on {my_name!r} vs {theirs.dtype} on "
                              f"{handshake.agent_name!r} (set the same kv_cache_dtype on both)")
    if differences:
        raise KVLayoutMismatch(f"peer {handshake.agent_name!r} has a different KV block layout than "
                               f"{my_name!r} ({'; '.join(differences)}); replicas that exchange KV must run the "
                               "same model, dtype, FP8 scales, block size, tensor-parallel size and attention layout")


def block_bytes(agent: KVTransferAgent) -> int:
    """Bytes one block moves across all of the agent's ranks (a tensor-parallel replica pulls on each)."""
    return agent.layout.total_bytes_per_block(agent.tp_size)


def make_kv_transfer_agent(config: KVTransferConfig, name: str, kv_cache: torch.Tensor, layout: KVBlockLayout,
                           host_cache: torch.Tensor | None = None) -> KVTransferAgent:
    """The configured transport's agent for one rank, with ``kv_cache`` registered (and the host tier's
    ``host_cache``, [num_host_blocks, *one block], when there is one)."""
    module, cls = _TRANSPORTS[config.transport].split(":")
    return getattr(importlib.import_module(module), cls)(config, name, kv_cache, layout, host_cache)


def peer_layout(handshake: KVHandshake, medium: str) -> KVBlockLayout:
    """The peer's layout of the tier ``medium``; a KVTransferError when it has no such tier."""
    if medium == DEVICE_MEDIUM:
        return handshake.layout
    if medium == HOST_MEDIUM and handshake.host_layout is not None:
        return handshake.host_layout
    raise KVTransferError(f"peer {handshake.agent_name!r} has no {medium!r} tier to read from")


class RunnerCache(Protocol):
    """What an agent registers of one rank's model runner (replica/worker/model_runner.py)."""

    kv_cache: torch.Tensor
    kv_layout: KVBlockLayout
    """The runner's one layout of its cache, computed when the cache was allocated."""

    @property
    def host_kv_cache(self) -> torch.Tensor | None:
        """The host tier's tensor (None without a tier)."""
        ...


def agent_for_runner(config: KVTransferConfig, name: str, runner: RunnerCache) -> KVTransferAgent:
    """A transfer agent with a ModelRunner's KV cache registered, and its host tier's when it has one."""
    return make_kv_transfer_agent(config, name, runner.kv_cache, runner.kv_layout, runner.host_kv_cache)
