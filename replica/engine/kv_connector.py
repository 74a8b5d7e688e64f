"""The engine's one seam for KV that lives outside the device pool's block tables (vLLM v1's ``KVConnectorBase_V1``,
its scheduler side).

    LLMEngine(config, runner, kv_connectors=[factory, ...])      each factory(KVConnectorContext) -> KVConnector
        step():            connector.update_connector_output()   what the runner finished (host tier: stores landed)
        a request ends:    connector.request_finished(request)   before its blocks are freed (a lease takes them)
        integrity check:   connector.held_blocks()                device blocks held outside any block table
        engine thread:     connector.between_steps(), idle_timeout()   work polled between steps, idle or not
        /load:             connector.load_fields()                the report's fields this connector owns
        shutdown:          connector.shutdown()

Two connectors plug in here: the host tier's (``OffloadConnector``, offload_connector.py; vLLM's
``OffloadingConnector``), built by the engine when its cache manager has a host tier, and the KV transfers between
replicas (``EngineKVTransfers``, kv_transfers.py; vLLM's ``NixlConnector``), built by ``default_kv_connectors``
(connector_defaults.py).
The engine calls them in that order. vLLM's ``get_num_new_matched_tokens`` / ``update_state_after_alloc`` /
``build_connector_meta`` have no method here: the host tier's lookup, load planning and the step's copies are
decided inside the KV cache manager's own prefix walk (kvcache/offload.py), and a pull fills the prefix cache
before its request is added (kv_transfer/prefix_pull.py).
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

    def request_finished(self, request: Request) -> None:
        """``request`` ended (finished, aborted or failed); its blocks are freed right after this returns."""
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

