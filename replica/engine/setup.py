"""What ``LLMEngine`` builds besides its scheduler: the tokenizer it detokenizes with and its KV event publisher."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from kvmesh.replica.config import EngineConfig

if TYPE_CHECKING:
    from kvmesh.events.config import PublisherConfig
    from kvmesh.events.publisher import ZmqEventPublisher
    from kvmesh.events.schema import BlockStored
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


def make_event_publisher(events: PublisherConfig, snapshot_source: Callable[[], list[BlockStored]]) -> ZmqEventPublisher:
    """The replica's KV event publisher, configured by the events section whole."""
    from kvmesh.events.publisher import ZmqEventPublisher

    return ZmqEventPublisher(events, snapshot_source=snapshot_source)
