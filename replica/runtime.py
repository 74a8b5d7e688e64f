"""A whole serving replica in one process: tokenizer, engine (+ TP), event publisher, HTTP server.

Used by the Ray actor (actor.py) and by ``kvmesh replica`` standalone. Each part takes its config
section whole: the engine its ``EngineConfig``, the publisher the ``events`` section (with the
server's addresses), the HTTP server its ``ReplicaServerConfig`` and the OpenAI front's
``FrontendConfig``. ``start`` returns once the HTTP socket is bound and the first event batch --
``[AllBlocksCleared()]`` at seq 0, "this replica's cache is empty" -- is queued, so a subscriber can
always tell a fresh incarnation.

Graceful shutdown: stop accepting (/health -> 503, new requests -> 503), abort the requests still waiting
for their grammar to compile, let the other in-flight requests finish for ``graceful_s``, abort the rest, stop HTTP,
stop the engine and close the publisher
(nothing is published after the engine stops, so nothing stale reaches the stream).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from kvmesh.events.config import PublisherConfig
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.kv_transfer.config import KVTransferConfig
from kvmesh.replica.openai.config import FrontendConfig
from kvmesh.replica.server.config import ReplicaServerConfig

if TYPE_CHECKING:
    from kvmesh.events.publish.publisher import ZmqEventPublisher
    from kvmesh.replica.engine.async_llm import AsyncLLM
    from kvmesh.replica.executor.factory import ExecutorOptions
    from kvmesh.replica.interfaces import ModelRunnerInterface
    from kvmesh.replica.openai.runner import HTTPServer
    from kvmesh.replica.server.kv_transfer import KVTransferService
    from kvmesh.replica.server.state import ServerState
    from ray.util.placement_group import PlacementGroup

logger = logging.getLogger(__name__)

Endpoints = dict[str, str | int | float | None]
"""What a replica tells whoever needs it: HTTP URL, event endpoints, model, block size (JSON)."""


class ReplicaRuntime:
    """Owns everything one replica runs; build it with ``ReplicaRuntime.start``."""

    def __init__(self, llm: AsyncLLM, publisher: ZmqEventPublisher | None, http: HTTPServer, state: ServerState,
                 events: PublisherConfig | None, replica_id: str):
        self.llm = llm  # the engine on its thread (the server's EngineClient); owns the model runner
        self.publisher = publisher  # None without events
        self.http = http  # on its own thread
        self.state = state
        self.events = events  # the publisher's section, its addresses filled in; None without events
        self.replica_id = replica_id
        self._closed = False

    @classmethod
    def start(cls, engine: EngineConfig, server: ReplicaServerConfig | None = None,
              events: PublisherConfig | None = None, frontend: FrontendConfig | None = None, *,
              replica_id: str = "replica-0", model_runner: ModelRunnerInterface | None = None,
              placement_group: PlacementGroup | None = None, executor: ExecutorOptions | None = None,
              kv_transfer: KVTransferConfig | None = None) -> ReplicaRuntime:
        """Build and start a replica from its sections (None: the section's defaults). The publisher binds
        where ``server`` says (``server.publisher_config``; ``event_port`` null: no events).
        ``placement_group`` and ``executor`` place the TP workers (TP > 1). ``kv_transfer.enabled``: a transfer
        agent with the KV cache registered, /kv/* and kv_transfer_params served (server/kv_transfer.py)."""
        from kvmesh.replica.engine.async_llm import AsyncLLM
        from kvmesh.replica.openai.runner import HTTPServer
        from kvmesh.replica.server.app import build_app
        from kvmesh.replica.server.state import ServerState
        from kvmesh.replica.serving.tokenizer import load_tokenizer

        t0 = time.monotonic()
        kv_transfer = kv_transfer or KVTransferConfig()
        check_kv_transfer(kv_transfer, engine)
        server, frontend = server or ReplicaServerConfig(), frontend or FrontendConfig()
        events = server.publisher_config(events or PublisherConfig())
        tokenizer = load_tokenizer(engine.tokenizer_path, max_model_len=engine.max_model_len,
                                   chat_template=frontend.chat_template)
        llm = AsyncLLM.from_config(engine, tokenizer.hf, model_runner=model_runner, events=events,
                                   placement_group=placement_group, **(executor or {}))
        tokenizer.max_model_len = llm.max_model_len
        publisher = llm.engine.event_publisher
        if publisher is not None:
            from kvmesh.events.schema import AllBlocksCleared

            publisher.publish([AllBlocksCleared()])  # seq 0 of every incarnation: "my cache is empty"
        try:
            state = ServerState(llm, tokenizer, server, frontend, engine.model,
                                extra_info={"replica_id": replica_id, **_event_info(publisher, events)})
            if kv_transfer.enabled:
                state.kv_transfer = _kv_transfer_service(kv_transfer, llm, state, replica_id)
            if publisher is not None and publisher.replay_endpoint is not None and events.load_interval_s > 0:
                from kvmesh.replica.server.load_publishing import LoadPublishing

                state.load_publishing = LoadPublishing(llm.engine, publisher, events.load_interval_s).start()
            http = HTTPServer(build_app(state), host=server.host, port=server.port, frontend=frontend,
                              name="replica-http")
            http.start_in_thread()
            if engine.structured_outputs.warm_start:
                threading.Thread(target=llm.engine.structured_output.warm, name="kvmesh-grammar-warm",
                                 daemon=True).start()
        except BaseException:
            llm.shutdown()
            raise
        runtime = cls(llm, publisher, http, state, events, replica_id)
        logger.info("replica %s serving %s at %s (%.1fs)", replica_id, engine.model, http.url, time.monotonic() - t0)
        return runtime

    # ------------------------------------------------------------ queries
    def endpoints(self) -> Endpoints:
        llm = self.llm
        return {"http_url": self.http.url, "model": self.state.model_path, "served_model_name": self.state.model_name,
                "block_size": llm.block_size, "max_model_len": llm.max_model_len, "num_kv_blocks": llm.num_kv_blocks,
                "tensor_parallel_size": llm.tensor_parallel_size, "kv_transfer": self.state.kv_transfer is not None,
                **_event_info(self.publisher, self.events)}

    def dead_reason(self) -> str | None:
        return self.llm.dead_reason()

    def broken_reason(self, probe_timeout_s: float = 10.0) -> str | None:
        """Like ``dead_reason`` but not counting a deliberate shutdown; also pings the TP ranks, so a
        rank that dies while the replica is idle is noticed before a request needs it."""
        if self.llm.draining or self._closed:
            return None
        return self.llm.check_health(probe_timeout_s)

    def stats_dict(self) -> dict[str, float | dict[str, int]]:
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
        llm.abort_compiling()
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
        if self.state.load_publishing is not None:
            self.state.load_publishing.close()
        llm.shutdown()
        if self.state.kv_transfer is not None:
            self.state.kv_transfer.agent.close()
        self._closed = True
        return clean


def _event_info(publisher: ZmqEventPublisher | None, events: PublisherConfig | None) -> Endpoints:
    if publisher is None or events is None:
        return {"events_endpoint": None, "replay_endpoint": None, "events_topic": None}
    return {"events_endpoint": publisher.endpoint, "replay_endpoint": publisher.replay_endpoint,
            "events_topic": events.topic}


def check_kv_transfer(config: KVTransferConfig, engine: EngineConfig) -> None:
    """Refuse what KV transfer cannot do, before anything loads."""
    if config.enabled and engine.emulation.enabled:
        raise ValueError("kv_transfer moves KV bytes, and an emulated replica (--emulate) holds none; "
                         "turn one of them off")
    if config.enabled and engine.tensor_parallel_size > 1 and config.transport == "local":
        raise ValueError(f"kv_transfer transport 'local' copies inside one process, but tensor_parallel_size "
                         f"{engine.tensor_parallel_size} runs each rank in its own process; use "
                         "--kv-transfer-transport nixl")


def _kv_transfer_service(config: KVTransferConfig, llm: AsyncLLM, state: ServerState,
                         replica_id: str) -> KVTransferService:
    """The transfer agent with the runner's KV cache registered (every rank's, under tensor parallelism), and
    the service around it."""
    import uuid

    from kvmesh.replica.kv_transfer.agent import agent_for_runner
    from kvmesh.replica.kv_transfer.errors import KVTransferError
    from kvmesh.replica.kv_transfer.leases import LeaseCaps
    from kvmesh.replica.server.kv_transfer import KVTransferService

    name = f"{replica_id}-{uuid.uuid4().hex[:8]}"
    try:
        if llm.tensor_parallel_size > 1:  # one agent per rank, in its worker (kv_transfer/tp_agent.py)
            from kvmesh.replica.kv_transfer.tp_agent import TPKVTransferAgent

            agent = TPKVTransferAgent(config, name, llm.runner)
        else:
            agent = agent_for_runner(config, f"{name}-rank-0", llm.runner)
    except KVTransferError as e:  # nixl missing or unable to start here: said as a start-up error
        raise ValueError(f"kv_transfer (transport {config.transport}) cannot start: {e}; install nixl "
                         "(the engine extra) or turn KV transfer off (--no-kv-transfer)") from None
    service = KVTransferService(config, agent, llm, state.kv_metrics, replica_id, state.model_name)
    llm.kv_transfers.turn_on(LeaseCaps.of(config), service.load)  # before the server takes a lease
    return service
