"""What ``LLMEngine`` builds besides its scheduler: its KV cache manager, the tokenizer it detokenizes with and
its KV event publisher."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from kvmesh.events.schema import DEVICE_MEDIUM
from kvmesh.replica.config import EngineConfig

if TYPE_CHECKING:
    from kvmesh.events.config import PublisherConfig
    from kvmesh.events.publish.publisher import ZmqEventPublisher
    from kvmesh.events.schema import BlockStored, KVEvent
    from kvmesh.kvcache.block import KVCacheBlock
    from kvmesh.kvcache.kv_cache_manager import KVCacheManager
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
