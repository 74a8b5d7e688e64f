"""What ``LLMEngine`` builds besides its scheduler: its KV cache manager, the tokenizer it detokenizes with, its
KV event publisher, its KV connectors and its drafter."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from kvmesh.events.schema import DEVICE_MEDIUM
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.engine.connector_defaults import default_kv_connectors
from kvmesh.replica.engine.kv_connector import KVConnectorContext, KVConnectorFactory
from kvmesh.replica.engine.kv_connectors import KVConnectors
from kvmesh.replica.engine.offload_connector import OffloadConnector
from kvmesh.replica.executor.factory import local_draft_model
from kvmesh.replica.spec_decode.config import parse_speculative_config
from kvmesh.replica.spec_decode.drafting import Drafter, make_drafter

if TYPE_CHECKING:
    from kvmesh.events.config import PublisherConfig
    from kvmesh.events.publish.publisher import ZmqEventPublisher
    from kvmesh.events.schema import BlockStored, KVEvent
    from kvmesh.kvcache.block import KVCacheBlock
    from kvmesh.kvcache.kv_cache_manager import KVCacheManager
    from kvmesh.replica.engine.request import Request
    from kvmesh.replica.interfaces import ModelRunnerInterface
    from kvmesh.replica.serving.hf_tokenizer import HFTokenizer

logger = logging.getLogger(__name__)

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def load_engine_tokenizer(config: EngineConfig) -> HFTokenizer | None:
    """The HF tokenizer, or None when there is none (dummy models without a directory)."""
    from pathlib import Path

    path = config.tokenizer_path
    if config.load_format == "dummy" and config.tokenizer is None and not Path(path).exists():
        return None
    if Path(path).is_dir() and not any((Path(path) / f).exists() for f in _TOKENIZER_FILES):
        logger.warning("no tokenizer in %s: outputs will have token ids but no text", path)
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def make_event_publisher(events: PublisherConfig,
                         snapshot_source: Callable[[], list[BlockStored]]) -> ZmqEventPublisher:
    """The replica's KV event publisher, configured by the events section whole."""
    from kvmesh.events.publish.publisher import ZmqEventPublisher

    return ZmqEventPublisher(events, snapshot_source=snapshot_source)


def make_kv_cache_manager(config: EngineConfig, num_blocks: int, num_host_blocks: int,
                          event_sink: Callable[[KVEvent], None] | None,
                          held_elsewhere: Callable[[], list[KVCacheBlock]] | None = None) -> KVCacheManager:
    """The block pool and prefix cache over ``num_blocks`` device blocks, with a host tier of
    ``num_host_blocks`` (0: none); ``event_sink`` gets its KV events; ``held_elsewhere`` names the device blocks
    the engine's connectors hold (its integrity check counts them)."""
    from kvmesh.kvcache.hashing import generate_seed
    from kvmesh.kvcache.kv_cache_manager import KVCacheManager

    hash_seed = config.hash_seed or generate_seed()
    return KVCacheManager(
        num_blocks, config.block_size, hash_seed.encode() if isinstance(hash_seed, str) else hash_seed,
        enable_caching=config.enable_prefix_caching, event_sink=event_sink, eviction_policy=config.eviction_policy,
        medium=DEVICE_MEDIUM,  # the engine's own cache on every device, as vLLM's block pool writes it
        num_host_blocks=num_host_blocks, held_elsewhere=held_elsewhere,
    )


def make_kv_connectors(config: EngineConfig, kv_cache_manager: KVCacheManager, model_runner: ModelRunnerInterface,
                       kv_connectors: Sequence[KVConnectorFactory] | None) -> KVConnectors:
    """The engine's connectors of KV held or moved outside the block tables (kv_connector.py), built by
    ``kv_connectors`` (None: ``default_kv_connectors``); the host tier's comes first when the cache has one. In
    this order at every point of the seam."""
    context = KVConnectorContext(config, kv_cache_manager, model_runner)
    factories: list[KVConnectorFactory] = [OffloadConnector] if kv_cache_manager.offload is not None else []
    factories += default_kv_connectors() if kv_connectors is None else kv_connectors
    return KVConnectors([make(context) for make in factories])


def make_engine_drafter(config: EngineConfig, vocab_size: int, max_model_len: int, num_kv_blocks: int,
                        running: Callable[[], Iterable[Request]]) -> Drafter | None:
    """The drafter of the config's ``speculative_config`` (spec_decode/; None: speculative decoding off), its
    draft model, if any, loaded in this process now; it drafts for the scheduler's ``running`` requests."""
    spec = parse_speculative_config(config.speculative_config)  # checked by the config already
    return make_drafter(spec, max_model_len, config.seed,
                        lambda: local_draft_model(config, spec, vocab_size, max_model_len, num_kv_blocks), running)
