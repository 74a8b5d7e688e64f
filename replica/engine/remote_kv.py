"""A request's ``kv_transfer_params`` as the engine takes them: they ride with the request into the scheduler, and
what the transfer did comes back on its outputs (vLLM v1's request ``kv_transfer_params``).

    decode side   RemoteKV(remote=source)               the scheduler asks the KV transfer connector
                                                        (kv_transfers.py) for the prompt's blocks on a peer; the
                                                        request waits (WAITING_FOR_REMOTE_KVS) while they are read,
                                                        then runs hitting them; its outputs carry the pull's
                                                        ``PullResult`` (``RequestOutput.kv_pull``)
    prefill side  RemoteKV(lease_ttl_s=..., peer=...)   at its finish the connector leases the prompt's blocks for
                                                        ``peer``; the handle is the final output's ``kv_lease`` (the
                                                        response's ``kv_transfer_params``)

The engine names it ``remote_kv``: "transfer" stays off the host tier's path (tests/test_host_tier_names.py).

A ``RemoteSource`` is the server's half of one pull (server/kv_transfer.py): asking the holder for its blocks
(its lease, the handshake) and letting the lease go run on the server's event loop, never on the engine thread.
"""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from kvmesh.replica.kv_transfer.agent import KVTransferAgent


@dataclass(frozen=True, slots=True)
class PullResult:
    """How a pull went: ``ok`` (tokens moved), ``skipped`` (nothing to move) or ``failed`` (computed instead)."""

    outcome: str
    tokens: int = 0
    bytes: int = 0

    def headers(self) -> dict[str, str]:
        """The response headers of the contract (``x-kvmesh-kv-pull`` only when a pull was tried)."""
        return {"x-kvmesh-kv-pulled-tokens": str(self.tokens), "x-kvmesh-kv-pulled-bytes": str(self.bytes),
                "x-kvmesh-kv-pull": self.outcome}


NO_PULL = {"x-kvmesh-kv-pulled-tokens": "0", "x-kvmesh-kv-pulled-bytes": "0"}
"""The headers of an answer without a pull."""


@dataclass(frozen=True, slots=True)
class RemoteBlocks:
    """What a holder's lease names of a prompt: its leading full blocks, to read into this replica's cache."""

    agent: KVTransferAgent
    """This replica's transfer agent, with ``peer`` added."""
    peer: str
    """The holder's agent name."""
    block_ids: list[int]
    """The holder's block ids, in prompt order."""
    media: list[str] | None = None
    """The holder's tier of each block (None: all on its device)."""


class RemoteSource(Protocol):
    """The server's half of one request's pull (any thread may call it; neither call waits)."""

    def lookup(self) -> concurrent.futures.Future[RemoteBlocks | PullResult]:
        """Ask the holder for the prompt's blocks: resolves to the blocks to read, or to the outcome without a read
        (``skipped``: nothing held or not a registered peer; ``failed``)."""
        ...

    def done(self, result: PullResult, error: BaseException | None = None) -> None:
        """The pull ended (``error``: why it failed): let the holder's lease go and count the pull."""
        ...

    async def ended(self) -> None:
        """Wait (on the server's loop) until what ``done`` started is over."""
        ...


@dataclass(frozen=True, slots=True)
class RemoteKV:
    """What a request asks of KV transfer (checked and resolved by the server: a registered peer, its caps)."""

    remote: RemoteSource | None = None
    """Decode side: pull the prompt's cached prefix from here before computing it."""
    lease_ttl_s: float | None = None
    """Prefill side: lease the prompt's blocks as the request finishes, for this many seconds (None: no lease)."""
    peer: str = "local"
    """Who asked for the lease (its x-kvmesh-replica-id, else its address): it counts against that peer's cap."""
    engine_id: str = ""
    """This replica's transfer agent name (the handle's ``remote_engine_id``)."""

    def handle(self, lease) -> dict:
        """The prefill side's ``kv_transfer_params`` for the decode side: ``lease`` as a handle (an empty lease:
        the decode side computes the prompt)."""
        return {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": lease.remote_block_ids,
                "remote_block_media": lease.remote_block_media, "remote_lease_id": lease.lease_id,
                "remote_engine_id": self.engine_id, "num_tokens": lease.num_tokens}
