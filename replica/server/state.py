"""What every handler of a replica's HTTP server needs: the engine client, the prompt renderer, names, metrics."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from kvmesh.replica.openai.config import FrontendConfig
from kvmesh.replica.openai.renderer import PromptRenderer
from kvmesh.replica.server.config import ReplicaServerConfig
from kvmesh.replica.server.kv_metrics import KVTransferMetrics
from kvmesh.replica.server.lora_models import ServedLoRAs
from kvmesh.replica.server.metrics import ReplicaMetrics
from kvmesh.replica.serving.model_names import check_model, model_aliases
from kvmesh.replica.serving.tokenizer import Tokenizer

if TYPE_CHECKING:
    from kvmesh.replica.engine.async_llm import AsyncLLM
    from kvmesh.replica.server.kv_transfer import KVTransferService
    from kvmesh.replica.server.load_publishing import LoadPublishing

Info = dict[str, str | int | bool | None]
"""A JSON object of scalars (``/server_info``, ``/model_info``, metric labels)."""


class ServerState:
    """What every handler needs: the engine client, the prompt renderer, names and metrics."""

    def __init__(self, engine_client: AsyncLLM, tokenizer: Tokenizer | None, server: ReplicaServerConfig,
                 frontend: FrontendConfig, model_path: str, extra_info: Mapping[str, str | int | None] | None = None):
        self.engine_client = engine_client
        self.tokenizer = tokenizer
        self.renderer = PromptRenderer(tokenizer, frontend)
        self.server = server
        self.frontend = frontend
        self.model_path = model_path
        self.model_name = server.served_model_name or model_path
        self.model_aliases = model_aliases(self.model_name, *server.served_model_aliases, model_path)
        """Every name the model answers to: the served name, the path, their absolute and resolved forms."""
        self.default_max_tokens = server.default_max_tokens
        self.extra_info = dict(extra_info or {})
        self.metrics = ReplicaMetrics(engine_client.get_stats, self.model_name,
                                      cache_info=_cache_config_info(engine_client))
        self.kv_metrics = KVTransferMetrics(self.metrics.registry, lambda: _lease_counts(engine_client),
                                            lambda: _quarantined_blocks(engine_client))
        self.kv_transfer: KVTransferService | None = None
        """The KV transfer front (runtime.py sets it when ``kv_transfer.enabled``); None: /kv/* answer 503."""
        self.loras = ServedLoRAs(engine_client, self.model_aliases, engine_client.config.enable_lora,
                                 engine_client.list_loras())  # --lora-modules, registered by the engine at start
        """The LoRA adapters served by name (``"model": "<adapter>"``, /v1/load_lora_adapter)."""
        self.load_publishing: LoadPublishing | None = None
        """The replica's load updates on its event stream (runtime.py starts them with a replay socket); None:
        it publishes no load."""

    def check_model(self, model: str | None) -> None:
        """A 404 unless ``model`` is unset, the base model (its served name or any form of its path) or a loaded
        adapter."""
        check_model(model, self.model_name, aliases=(*self.model_aliases, *self.loras.names()))

    def server_info(self, paths: bool) -> Info:
        """Engine settings; ``model_path`` is the host path only with ``paths`` (the operator), else the served
        name."""
        e = self.engine_client
        return {"model": self.model_name, "model_path": self.model_path if paths else self.model_name,
                "max_model_len": e.max_model_len,
                "block_size": e.block_size, "num_kv_blocks": e.num_kv_blocks,
                "tensor_parallel_size": e.tensor_parallel_size, "version": "kvmesh",
                "tokenizer_fingerprint": self.tokenizer.fingerprint if self.tokenizer is not None else None,
                "salt_secret_check": e.salt_secret_check,
                **self.extra_info}

    def model_info(self, paths: bool) -> Info:
        """The model's and tokenizer's paths (host paths only with ``paths``, the operator; else the served name)."""
        tokenizer_path = self.tokenizer.name if self.tokenizer is not None else self.model_path
        return {"model_path": self.model_path if paths else self.model_name,
                "tokenizer_path": tokenizer_path if paths else self.model_name,
                "served_model_name": self.model_name, "is_generation": True}


def _cache_config_info(engine: AsyncLLM) -> Info:
    """The labels of ``vllm:cache_config_info`` (vLLM's CacheConfig names; "gpu" blocks = KV blocks on any device)."""
    config = engine.config
    return {"block_size": engine.block_size, "num_gpu_blocks": engine.num_kv_blocks,
            "enable_prefix_caching": config.enable_prefix_caching,
            "gpu_memory_utilization": config.gpu_memory_utilization,
            "eviction_policy": config.eviction_policy, "cache_dtype": config.kv_cache_dtype}


def _lease_counts(engine: AsyncLLM) -> tuple[int, int, int]:
    """(active, released, expired) leases of the engine's KV transfer connector."""
    leases = engine.kv_transfers.leases
    return leases.active, leases.released, leases.expired


def _quarantined_blocks(engine: AsyncLLM) -> int:
    """Blocks of the engine's failed pulls still held until their read is over."""
    return engine.kv_transfers.quarantined_blocks
