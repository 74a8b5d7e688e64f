"""A whole serving replica in one process: tokenizer, engine (+ TP), event publisher, HTTP server.

Used by the Ray actor (actor.py) and by ``kvmesh replica`` standalone. ``start`` returns once
the HTTP socket is bound and the first event batch -- ``[AllBlocksCleared()]`` at seq 0, "this
replica's cache is empty" -- is queued, so a subscriber can always tell a fresh incarnation.

Graceful shutdown: stop accepting (/health -> 503, new requests -> 503), let in-flight requests
finish for ``graceful_s``, abort the rest, stop HTTP, stop the engine and close the publisher
(nothing is published after the engine stops, so nothing stale reaches the stream).
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from kvmesh.replica.config import EngineConfig

if TYPE_CHECKING:
    from kvmesh.replica.async_engine import AsyncLLM

logger = logging.getLogger(__name__)


def events_endpoints(host: str, event_port: int, replay_port: int) -> tuple[str, str]:
    """(PUB, ROUTER) endpoints that bind on ``host`` (port 0 = ephemeral)."""
    return f"bind://tcp://{host}:{event_port}", f"tcp://{host}:{replay_port}"


class ReplicaRuntime:
    """Owns everything one replica runs; build it with ``ReplicaRuntime.start``."""

    def __init__(self, llm: AsyncLLM, publisher: Any, http: Any, state: Any, replica_id: str):
        self.llm = llm  # the engine on its thread (the server's EngineClient); owns the model runner
        self.publisher = publisher  # events.publisher.ZmqEventPublisher, or None without events
        self.http = http  # openai.runner.HTTPServer (on its own thread)
        self.state = state  # server.ServerState
        self.replica_id = replica_id
        self._closed = False

    @classmethod
    def start(cls, config: EngineConfig, host: str = "127.0.0.1", http_port: int = 0, event_port: int | None = 0,
              replay_port: int = 0, api_key: str | None = None, served_model_name: str | None = None,
              replica_id: str = "replica-0", model_runner: Any = None,
              executor_kwargs: dict[str, Any] | None = None, frontend: Any = None) -> ReplicaRuntime:
        """Build and start a replica. ``event_port=None`` keeps ``config``'s event endpoints as given
        (None there: no events); otherwise events bind on ``host``. ``frontend`` is the HTTP front's
        ``FrontendConfig`` (limits, chat template, timeouts); None uses the defaults."""
        from kvmesh.replica.async_engine import AsyncLLM
        from kvmesh.replica.openai.config import FrontendConfig
        from kvmesh.replica.openai.runner import HTTPServer
        from kvmesh.replica.server import ServerConfig, ServerState, build_app
        from kvmesh.replica.serving.tokenizer import load_tokenizer

        t0 = time.monotonic()
        if event_port is not None:
            pub, replay = events_endpoints(host, event_port, replay_port)
            config = replace(config, kv_events_endpoint=pub, kv_events_replay_endpoint=replay)
        frontend = frontend or FrontendConfig()
        tokenizer = load_tokenizer(config.tokenizer_path, max_model_len=config.max_model_len,
                                   chat_template=frontend.chat_template)
        kwargs = {k: v for k, v in (executor_kwargs or {}).items() if v is not None}
        llm = AsyncLLM.from_config(config, tokenizer.hf, model_runner=model_runner, **kwargs)
        tokenizer.max_model_len = llm.max_model_len
        publisher = llm.event_publisher
        if publisher is not None:
            from kvmesh.events.schema import AllBlocksCleared

            publisher.publish([AllBlocksCleared()])  # seq 0 of every incarnation: "my cache is empty"
        try:
            server_config = ServerConfig(host=host, port=http_port, api_key=api_key,
                                         served_model_name=served_model_name, frontend=frontend)
            state = ServerState(llm, tokenizer, server_config, config.model,
                                extra_info={"replica_id": replica_id, **_event_info(publisher, config)})
            http = HTTPServer(build_app(state), host=host, port=http_port, frontend=frontend, name="replica-http")
            http.start_in_thread()
        except BaseException:
            llm.shutdown()
            raise
        runtime = cls(llm, publisher, http, state, replica_id)
        logger.info("replica %s serving %s at %s (%.1fs)", replica_id, config.model, http.url, time.monotonic() - t0)
        return runtime

    # ------------------------------------------------------------ queries
    def endpoints(self) -> dict[str, Any]:
        llm = self.llm
        return {"http_url": self.http.url, "model": self.state.model_path, "served_model_name": self.state.model_name,
                "block_size": llm.block_size, "max_model_len": llm.max_model_len, "num_kv_blocks": llm.num_kv_blocks,
                "tensor_parallel_size": llm.tensor_parallel_size, **_event_info(self.publisher, llm.config)}

    def dead_reason(self) -> str | None:
        return self.llm.dead_reason()

    def broken_reason(self, probe_timeout_s: float = 10.0) -> str | None:
        """Like ``dead_reason`` but not counting a deliberate shutdown; also pings the TP ranks, so a
        rank that dies while the replica is idle is noticed before a request needs it."""
        if self.llm.draining or self._closed:
            return None
        return self.llm.check_health(probe_timeout_s)

    def stats_dict(self) -> dict[str, Any]:
        s = self.llm.get_stats()
        return {"num_running": s.num_running, "num_waiting": s.num_waiting, "kv_cache_usage": s.kv_cache_usage,
                "prefix_cache_queries": s.prefix_cache_queries, "prefix_cache_hits": s.prefix_cache_hits,
                "num_preemptions": s.num_preemptions, "num_prompt_tokens": s.num_prompt_tokens,
                "num_generation_tokens": s.num_generation_tokens, "num_finished": dict(s.num_finished)}

    # ------------------------------------------------------------ shutdown
    def close_events(self) -> None:
        if self.publisher is not None:
            try:
                self.publisher.close()
            except Exception:  # noqa: BLE001 - going down anyway
                pass

    def shutdown(self, graceful_s: float = 10.0) -> bool:
        """Drain then stop; True when every in-flight request finished on its own."""
        if self._closed:
            return True
        llm = self.llm
        llm.draining = True
        deadline = time.monotonic() + graceful_s
        while llm.num_unfinished() and time.monotonic() < deadline:
            time.sleep(0.02)
        clean = llm.num_unfinished() == 0
        if not clean:
            n = llm.abort_all()
            logger.warning("replica %s: aborted %d unfinished requests after %.1fs", self.replica_id, n, graceful_s)
            time.sleep(0.2)  # let the streams receive their final "abort" output
        self.http.stop_thread()
        self.state.renderer.close()
        llm.shutdown()
        self._closed = True
        return clean


def _event_info(publisher: Any, config: EngineConfig) -> dict[str, Any]:
    if publisher is None:
        return {"events_endpoint": None, "replay_endpoint": None, "events_topic": None}
    return {"events_endpoint": publisher.endpoint, "replay_endpoint": publisher.replay_endpoint,
            "events_topic": config.kv_events_topic}
