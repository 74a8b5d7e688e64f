"""The host tier's connector (vLLM's ``OffloadingConnector``, scheduler side): the engine's view of the copies
between the device cache and host memory.

The KV cache manager plans them (kvcache/offload.py) and the runner performs them (worker/kv_offload.py); this
connector closes the loop at the start of each step (the stores the runner saw land become findable in the host
tier) and reports the tier on ``/load``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvmesh.kvcache.block import KVCacheBlock
    from kvmesh.kvcache.kv_cache_manager import KVCacheManager
    from kvmesh.replica.engine.kv_connector import KVConnectorContext
    from kvmesh.replica.engine.request import Request
    from kvmesh.replica.interfaces import ModelRunnerInterface


class OffloadConnector:
    """A ``KVConnector`` for the host tier of one engine (built only when its cache manager has one)."""

    def __init__(self, context: KVConnectorContext) -> None:
        self.kv_cache_manager: KVCacheManager = context.kv_cache_manager
        self.model_runner: ModelRunnerInterface = context.model_runner
        self.tp_size = context.config.tensor_parallel_size

    def update_connector_output(self) -> None:
        """Copies to the host tier that landed become findable there (never waits for one)."""
        self.kv_cache_manager.complete_offload_stores(self.model_runner.finished_offload_stores())

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        return 0, False  # its hits are found in the cache manager's own prefix walk

    def update_state_after_alloc(self, request: Request, blocks: list[KVCacheBlock], num_external_tokens: int) -> None:
        return None

    def get_finished(self) -> set[str]:
        return set()

    def request_finished(self, request: Request) -> dict | None:
        return None

    def held_blocks(self) -> list[KVCacheBlock]:
        """None: the blocks held for a store in flight are the cache manager's own (``check_integrity`` counts
        ``OffloadingManager.held_device_blocks``)."""
        return []

    def between_steps(self) -> None:
        return None

    def idle_timeout(self) -> float | None:
        return None

    def load_fields(self) -> dict:
        """The ``/load`` fields of the host tier and its copies (none without a tier)."""
        offload, copier = self.kv_cache_manager.offload, self.model_runner.kv_offload
        layout = self.model_runner.kv_layout  # the one bytes-per-block figure (replica/kv_layout.py)
        if offload is None or copier is None or layout is None:
            return {}
        return {"kv_block_bytes": layout.total_bytes_per_block(self.tp_size), "h2d_bytes_per_s": copier.h2d_bytes_per_s,
                "num_host_kv_blocks": offload.host.num_blocks, "host_kv_cache_usage": offload.host.usage()}

    def shutdown(self) -> None:
        return None
