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
from typing import Any

from kvmesh.replica.config import EngineConfig

logger = logging.getLogger(__name__)


def events_endpoints(host: str, event_port: int, replay_port: int) -> tuple[str, str]:
    """(PUB, ROUTER) endpoints that bind on ``host`` (port 0 = ephemeral)."""
    return f"bind://tcp://{host}:{event_port}", f"tcp://{host}:{replay_port}"


class ReplicaRuntime:
    """Owns everything one replica runs; build it with ``ReplicaRuntime.start``."""

    def __init__(self, engine: Any, tokenizer: Any, http: Any, state: Any, replica_id: str):
        self.engine = engine  # server_engine.EngineClient
        self.tokenizer = tokenizer
        self.http = http  # openai.runner.HTTPServer (on its own thread)
        self.state = state
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
        from kvmesh.replica.openai.config import FrontendConfig
        from kvmesh.replica.openai.runner import HTTPServer
        from kvmesh.replica.openai.tokenizer import load_tokenizer
        from kvmesh.replica.server import ServerConfig, ServerState, build_app
        from kvmesh.replica.server_engine import build_engine_client

        t0 = time.monotonic()
        if event_port is not None:
            pub, replay = events_endpoints(host, event_port, replay_port)
            config = replace(config, kv_events_endpoint=pub, kv_events_replay_endpoint=replay)
        frontend = frontend or FrontendConfig()
        tokenizer = load_tokenizer(config.tokenizer_path, max_model_len=config.max_model_len,
                                   chat_template=frontend.chat_template)
        kwargs = {k: v for k, v in (executor_kwargs or {}).items() if v is not None}
        engine = build_engine_client(config, tokenizer, model_runner=model_runner, **kwargs)
        tokenizer.max_model_len = engine.max_model_len
        publisher = engine.engine.event_publisher
        if publisher is not None:
            from kvmesh.events.schema import AllBlocksCleared

            publisher.publish([AllBlocksCleared()])  # seq 0 of every incarnation: "my cache is empty"
        try:
            server_config = ServerConfig(host=host, port=http_port, api_key=api_key,
                                         served_model_name=served_model_name, frontend=frontend)
            state = ServerState(engine, tokenizer, server_config, config.model,
                                extra_info={"replica_id": replica_id, **_event_info(publisher, config)})
            http = HTTPServer(build_app(state), host=host, port=http_port, frontend=frontend, name="replica-http")
            http.start_in_thread()
        except BaseException:
            _stop_engine(engine)
            raise
        runtime = cls(engine, tokenizer, http, state, replica_id)
        logger.info("replica %s serving %s at %s (%.1fs)", replica_id, config.model, http.url, time.monotonic() - t0)
        return runtime

    # ------------------------------------------------------------ queries
    def endpoints(self) -> dict[str, Any]:
        e = self.engine
        return {"http_url": self.http.url, "model": self.state.model_path, "served_model_name": self.state.model_name,
                "block_size": e.block_size, "max_model_len": e.max_model_len, "num_kv_blocks": e.num_kv_blocks,
                "tensor_parallel_size": e.tensor_parallel_size,
                **_event_info(e.engine.event_publisher, e.engine.config)}

    def dead_reason(self) -> str | None:
        return self.engine.dead_reason()

    def broken_reason(self, probe_timeout_s: float = 10.0) -> str | None:
        """Like ``dead_reason`` but not counting a deliberate shutdown; also pings the TP ranks, so a
        rank that dies while the replica is idle is noticed before a request needs it."""
        if self.engine.draining or self._closed:
            return None
        check = getattr(self.engine.runner, "check_health", None)
        if check is not None:
            check(probe_timeout_s)
        return self.engine.dead_reason()

    def stats_dict(self) -> dict[str, Any]:
        s = self.engine.get_stats()
        return {"num_running": s.num_running, "num_waiting": s.num_waiting, "kv_cache_usage": s.kv_cache_usage,
                "prefix_cache_queries": s.prefix_cache_queries, "prefix_cache_hits": s.prefix_cache_hits,
                "num_preemptions": s.num_preemptions, "num_prompt_tokens": s.num_prompt_tokens,
                "num_generation_tokens": s.num_generation_tokens, "num_finished": dict(s.num_finished)}

    # ------------------------------------------------------------ shutdown
    def close_events(self) -> None:
        pub = self.engine.engine.event_publisher
        if pub is not None:
            try:
                pub.close()
            except Exception:  # noqa: BLE001 - going down anyway
                pass

    def shutdown(self, graceful_s: float = 10.0) -> bool:
        """Drain then stop; True when every in-flight request finished on its own."""
        if self._closed:
            return True
        self.engine.draining = True
        deadline = time.monotonic() + graceful_s
        while self.engine.num_unfinished() and time.monotonic() < deadline:
            time.sleep(0.02)
        clean = self.engine.num_unfinished() == 0
        if not clean:
            n = self.engine.abort_all()
            logger.warning("replica %s: aborted %d unfinished requests after %.1fs", self.replica_id, n, graceful_s)
            time.sleep(0.2)  # let the streams receive their final "abort" output
        self.http.stop_thread()
        self.state.renderer.close()
        _stop_engine(self.engine)
        self._closed = True
        return clean


def _event_info(publisher: Any, config: EngineConfig) -> dict[str, Any]:
    if publisher is None:
        return {"events_endpoint": None, "replay_endpoint": None, "events_topic": None}
    return {"events_endpoint": publisher.endpoint, "replay_endpoint": publisher.replay_endpoint,
            "events_topic": config.kv_events_topic}


def _stop_engine(engine: Any) -> None:
    """Stop the engine thread, close the publisher (engine.close) and the TP workers."""
    try:
        engine.llm.shutdown()
    finally:
        runner = engine.runner
        if hasattr(runner, "shutdown"):
            runner.shutdown()
