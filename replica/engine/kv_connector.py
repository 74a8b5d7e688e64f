"""The engine's one seam for KV that lives outside the device pool's block tables (vLLM v1's ``KVConnectorBase_V1``,
its scheduler side).

    LLMEngine(config, runner, kv_connectors=[factory, ...])      each factory(KVConnectorContext) -> KVConnector
        step():            connector.update_connector_output()   what the runner finished (host tier: stores landed)
        schedule():        connector.get_finished()              requests whose remote KV load ended
        a waiting request: connector.get_num_new_matched_tokens(request, num_computed_tokens)
                           -> (tokens, load_async): tokens another replica holds past the local prefix (None: not
                           known yet, ask again next step); load_async: the request waits while they are read,
                           after connector.update_state_after_alloc(request, local_blocks, tokens)
        a request ends:    connector.request_finished(request)   before its blocks are freed (a lease takes
                           them); the handle its final output carries (``kv_lease``), or None
        integrity check:   connector.held_blocks()                device blocks held outside any block table
        engine thread:     connector.between_steps(), idle_timeout()   work polled between steps, idle or not
        /load:             connector.load_fields()                the report's fields this connector owns
        shutdown:          connector.shutdown()

Two connectors plug in here: the host tier's (``OffloadConnector``, offload_connector.py; vLLM's
``OffloadingConnector``), built by the engine when its cache manager has a host tier, and the KV transfers between
replicas (``EngineKVTransfers``, kv_transfers.py; vLLM's ``NixlConnector``), built by ``default_kv_connectors``
(connector_defaults.py).
The engine calls them in that order. vLLM's ``build_connector_meta`` has no method here: the host tier's lookup,
load planning and the step's copies are decided inside the KV cache manager's own prefix walk (kvcache/offload.py).
Unlike vLLM's scheduler, kvmesh's allocates nothing for a remote load: the connector allocates and holds the read's
blocks itself (a failed read's stay quarantined outside any block table) and caches them as the read lands, so the
request then hits them in the prefix cache.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from kvmesh.kvcache.block import KVCacheBlock
    from kvmesh.kvcache.kv_cache_manager import KVCacheManager
    from kvmesh.replica.config import EngineConfig
    from kvmesh.replica.engine.request import Request
    from kvmesh.replica.interfaces import ModelRunnerInterface


@runtime_checkable
class KVConnector(Protocol):
    """What the engine asks of KV kept or moved outside its block tables; only the engine thread calls it."""

    def update_connector_output(self) -> None:
        """Start of a step, before scheduling: take what the runner finished since the last step (never waits)."""
        ...

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        """A waiting request's tokens this connector can load past its ``num_computed_tokens`` local ones, and
        whether asynchronously; (None, False): not known yet (the request keeps its place; asked again later)."""
        ...

    def update_state_after_alloc(self, request: Request, blocks: list[KVCacheBlock], num_external_tokens: int) -> None:
        """Start loading the ``num_external_tokens`` it promised (``blocks``: the request's local prefix)."""
        ...

    def get_finished(self) -> set[str]:
        """The requests whose asynchronous load ended (read or failed) since the last call: they may run now."""
        ...

    def request_finished(self, request: Request) -> dict | None:
        """``request`` ended (finished, aborted or failed); its blocks are freed right after this returns. The
        handle for its final output (``kv_lease``: the response's ``kv_transfer_params``; None: none)."""
        ...

    def held_blocks(self) -> list[KVCacheBlock]:
        """Device blocks this connector holds outside any block table, one entry per reference (the pool's
        integrity check counts them)."""
        ...

    def between_steps(self) -> None:
        """Work polled on the engine thread between steps, idle or not (never waits)."""
        ...

    def idle_timeout(self) -> float | None:
        """How long an idle engine thread may sleep before ``between_steps`` is due (None: until woken)."""
        ...

    def load_fields(self) -> dict:
        """This connector's fields of the ``/load`` report (``LoadReport``'s names); {} for none."""
        ...

    def shutdown(self) -> None:
        """The engine stops (its thread gone): answer what is in flight, let held blocks go where safe."""
        ...


@dataclass(frozen=True, slots=True)
class KVConnectorContext:
    """What a connector is built from: the engine's config, its KV cache manager and its model runner."""

    config: EngineConfig
    kv_cache_manager: KVCacheManager
    model_runner: ModelRunnerInterface


KVConnectorFactory = Callable[[KVConnectorContext], KVConnector]

