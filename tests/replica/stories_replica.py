"""A real stories260K replica (engine + OpenAI HTTP server) for the HTTP tests of this folder."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from kvmesh.replica.config import EngineConfig
from kvmesh.replica.openai.config import FrontendConfig
from kvmesh.replica.runtime import ReplicaRuntime
from kvmesh.replica.server.config import ReplicaServerConfig

from ..conftest import CHAT_TEMPLATE


@contextlib.contextmanager
def stories_replica(stories_path, **engine) -> Iterator[ReplicaRuntime]:
    """A replica on ephemeral loopback ports with a 4 MiB KV cache and a chat template; ``engine``
    overrides EngineConfig fields (``max_num_seqs``, ``dtype``, ...)."""
    config = EngineConfig(model=str(stories_path), **{"kv_cache_memory": 4 << 20, **engine})
    runtime = ReplicaRuntime.start(config, ReplicaServerConfig(host="127.0.0.1", port=0, event_port=0, replay_port=0),
                                   frontend=FrontendConfig(chat_template=CHAT_TEMPLATE))
    try:
        yield runtime
    finally:
        runtime.shutdown(graceful_s=1)
