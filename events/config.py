"""The events section of the config tree: how a replica publishes (``PublisherConfig``), what an
``EventSubscriber`` follows (``PublisherSource``) and its timeouts and limits (``SubscriberConfig``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvmesh.events import curve


@dataclass
class PublisherConfig:
    """Where and how a replica publishes its KV events."""

    endpoint: str = "bind://tcp://127.0.0.1:5557"
    """PUB address. vLLM's rule: wildcard host / ipc / inproc binds, others connect; ``bind://``
    forces a bind (default: loopback only), ``connect://`` a connect; port 0 = ephemeral."""
    replay_endpoint: str | None = "tcp://127.0.0.1:5558"
    """ROUTER address for replay and snapshot requests (always binds); None disables both."""
    topic: str = ""
    """ZeroMQ topic frame of every message; vLLM's default, the empty string (vllm-router subscribes to it)."""
    buffer_steps: int = 10_000
    """Batches kept for replay (ring buffer)."""
    buffer_max_bytes: int = 256 << 20
    """Byte cap of the replay ring buffer; the oldest batches go first."""
    hwm: int = 100_000
    """ZeroMQ send high-water mark (messages) of the PUB socket (the PUB drops beyond it)."""
    max_queue_size: int = 100_000
    """Batches waiting for the I/O thread before ``publish`` resyncs (or waits, without source)."""
    snapshot_chunk_blocks: int = 2048
    """Blocks per snapshot message."""
    shutdown_timeout: float = 1.0
    """Seconds ``close`` waits for queued batches to go out."""
    replay_requests_per_s: float = 50.0
    """Replay/snapshot requests answered per second, all peers together; beyond it replays are
    dropped unanswered (the asker times out) and snapshots answered "busy" (the asker backs off)."""
    replay_request_burst: int = 100
    """Requests answered at once before ``replay_requests_per_s`` applies."""
    snapshots_per_s: float = 1.0
    """Snapshots answered per second, all peers together (each one encodes the whole cache:
    ~0.1-0.2 s of this process's CPU per 100k blocks)."""
    snapshot_burst: int = 4
    """Snapshots answered at once (the most a flood can have queued in a moment)."""
    replay_bytes_per_s: int = 64 << 20
    """Bytes of replay/snapshot answers sent per second; requests wait (dropped) while in debt."""
    replay_max_queued_bytes: int = 128 << 20
    """Bytes of answers that may go out at once (the byte bucket's size): bounds what peers that
    never read can make this process hold."""

    load_interval_s: float = 0.005
    """Least seconds between two of the replica's load updates (events/load.py) that its engine steps cause, sent on
    the replay socket to the routers that ask, when its load changed (a request accepted is sent at once); 0 = it
    publishes no load (routers poll ``/load``)."""

    curve_secret_key: str | None = field(default=None, repr=False)
    """SECRET: this publisher's CURVE secret key (Z85). Set -> the PUB and replay sockets are CURVE
    servers: encrypted, and only peers that know the matching public key connect. None: plain
    text (vLLM-compatible; warned about when listening beyond loopback)."""
    curve_client_keys: tuple[str, ...] = ()
    """Public keys (Z85) of the subscribers allowed to connect (a ZAP allow-list); empty -> any
    peer that knows this publisher's public key."""

    def __post_init__(self) -> None:
        if not self.load_interval_s >= 0:
            raise ValueError(f"load_interval_s must be >= 0 seconds (0 = no load updates), got {self.load_interval_s}")
        if self.curve_secret_key is not None:
            curve.check_key(self.curve_secret_key, "secret")
            curve.require_curve()
        elif self.curve_client_keys:
            raise ValueError("PublisherConfig.curve_client_keys needs curve_secret_key (the server's key)")
        for key in self.curve_client_keys:
            curve.check_key(key, "client public")
        for name in ("buffer_steps", "buffer_max_bytes", "hwm", "max_queue_size", "snapshot_chunk_blocks",
                     "replay_requests_per_s", "replay_request_burst", "snapshots_per_s", "snapshot_burst",
                     "replay_bytes_per_s", "replay_max_queued_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"PublisherConfig.{name} must be positive, got {getattr(self, name)}")
        if not self.endpoint:
            raise ValueError("PublisherConfig.endpoint is empty; use e.g. bind://tcp://127.0.0.1:0")
        if self.shutdown_timeout < 0:
            raise ValueError(f"PublisherConfig.shutdown_timeout must be >= 0, got {self.shutdown_timeout}")


@dataclass
class PublisherSource:
    """One publisher to follow."""

    name: str
    """How batches of this publisher are labelled (e.g. the replica id)."""
    endpoint: str
    """Its PUB address: connect to it, or ``bind://tcp://host:port`` to listen for publishers
    that connect (several sources may share one bound address, told apart by ``topic``)."""
    replay_endpoint: str | None = None
    """Its replay/snapshot ROUTER address; None: no recovery (gaps are only counted)."""
    topic: str = ""
    """Topic prefix to subscribe to ("" = all)."""
    curve_server_key: str | None = None
    """The publisher's CURVE public key (Z85); None: ``SubscriberConfig.curve_server_key``."""

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("PublisherSource.name is empty; name the replica it follows")
        if "://" not in self.endpoint:
            raise ValueError(f"PublisherSource.endpoint {self.endpoint!r}: expected tcp://HOST:PORT")


@dataclass
class SubscriberConfig:
    """Timeouts and limits of an ``EventSubscriber``."""

    snapshot_on_start: bool = True
    """Ask each source with a replay endpoint for a snapshot when following starts (late join)."""
    replay_timeout: float = 2.0
    """Seconds without an answer before a replay request is given up (then: snapshot)."""
    snapshot_timeout: float = 5.0
    """Seconds without an answer before a snapshot request is given up (and counted)."""
    rcvhwm: int = 100_000
    """Most messages ZeroMQ queues per source (SUB and replay sockets); the mark used is also
    bounded by ``max_source_queue_bytes`` (see ``queue_messages``)."""
    max_source_queue_bytes: int = 64 << 20
    """Bytes ZeroMQ may hold for one source, on its SUB and on its replay socket alike: each
    socket's receive high-water mark times the largest message it accepts (``max_message_bytes``)
    stays within this. A publisher that sends faster than we read waits in its own queues."""
    max_pending: int = 100_000
    """Live batches held per source while a gap is being recovered."""
    max_pending_bytes: int = 32 << 20
    """Payload bytes of the live batches held per source while a gap is being recovered (decoded,
    a batch takes ~3-10x its payload); past it the oldest are dropped and recovered like lost ones."""
    idle_probe_interval: float | None = 1.0
    """Seconds a source may stay silent before we ask its replay socket for anything newer
    (finds batches lost at the tail of a burst); None disables probing."""
    reconnect_ivl_ms: int = 100
    """First reconnect delay after a publisher goes away."""
    reconnect_ivl_max_ms: int = 2000
    """Longest reconnect delay (exponential back-off up to this)."""
    max_payload_bytes: int = 8 << 20
    """Largest payload decoded: a bigger one is dropped unread and recovered like any lost batch.
    The largest batch accepted, ``max_batch_blocks`` blocks of 16 tokens, is ~6 MB on the wire
    (5 bytes per token id, 9 per hash) and ~0.1 s of the GIL to decode. A message frame over
    ``max_message_bytes`` (2x this) is refused by ZeroMQ itself: it drops the connection, which
    comes back and resyncs."""
    degraded_source_bytes_per_s: int = 1 << 20
    """Live payload bytes decoded per second from a *degraded* source, and its largest message;
    beyond it messages are dropped unread and counted as bad (so a flood keeps its source degraded).
    Enough for a source that behaves again to show it, too little for a flood to cost the process
    more than a few % of a core. (Trusted sources have no such budget: one core decodes ~60 MB/s.)"""
    source_busy_share: float = 0.25
    """Seconds per second of the I/O thread that one source's decoding and applying may take (its
    debt paid back before its socket is read again; the flood waits in its publisher), so a source
    sending batches that are costly to decode cannot starve the others. An honest replica's stream
    takes ~1 ms/s."""
    source_turn_s: float = 0.01
    """Seconds one socket is read per turn of the I/O loop (at least one message) before the other
    sources get theirs: an honest source waits at most one turn of each other source."""
    max_batch_blocks: int = 65_536
    """Most blocks one batch (or snapshot chunk) may name; a bigger one is dropped as bad (a
    legitimate one, e.g. a publisher's resync batch, is then recovered through a snapshot, whose
    chunks hold ``PublisherConfig.snapshot_chunk_blocks`` -- keep that below this)."""
    max_batch_events: int = 65_536
    """Most events one batch (or snapshot chunk) may hold, read from its header before anything is
    decoded (events/peek.py: a payload shaped unlike a batch is refused the same way, unread)."""
    max_source_blocks: int = 1_000_000
    """Most blocks one source may hold: a snapshot beyond it is refused, and consumers (the
    router) drop batches that would take a source past it."""
    max_snapshot_bytes: int | None = None
    """Payload bytes one snapshot may take (held decoded until it ends, a snapshot costs ~5x its payload); a bigger
    one is refused like one over ``max_source_blocks``, before its chunk is decoded. None: room for a whole cache of
    ``max_source_blocks`` 16-token blocks (~90 B each; ``snapshot_bytes``)."""
    bad_frame_threshold: int = 20
    """Bad frames within ``bad_frame_window_s`` that degrade a source (load-only routing)."""
    bad_frame_window_s: float = 10.0
    """Sliding window of the bad-frame count, in seconds."""
    degraded_probation_s: float = 2.0
    """A degraded source is trusted again once a snapshot resync was applied and it then sent no
    bad frame for this long (without snapshots: ``bad_frame_window_s``)."""
    recovery_free_requests: int = 4
    """Replay/snapshot requests of one source in quick succession before back-off starts."""
    recovery_backoff_s: float = 0.05
    """First back-off delay of a repeated replay/snapshot request; doubles per further request."""
    recovery_backoff_max_s: float = 5.0
    """Longest back-off delay between two replay/snapshot requests of one source."""
    recovery_quiet_s: float = 0.5
    """A source that made no request for this long (plus twice its last delay) starts afresh."""
    feed_restart_s: float = 0.5
    """Pause before the I/O thread's loop is rebuilt after it crashed."""
    max_lag_s: float = 5.0
    """Seconds a replica's KV events may trail its cache (published but not yet applied, applied that late,
    or a loss not yet resynced) before the router routes it by load only (degraded) until its stream catches up."""
    load_updates_per_s: float = 1000.0
    """Published load updates taken from one replica per second (events/subscribe/load_source.py): beyond it its
    newest waits, and a flood stays in its publisher's queues. An honest replica publishes one per step interval
    (``load_interval_s``, 5 ms), one per request it accepts and one per request that leaves its engine."""
    load_update_burst: int = 50
    """Published load updates taken from one replica at once before ``load_updates_per_s`` applies."""
    curve_server_key: str | None = None
    """CURVE public key (Z85) of the publishers (one per cluster); set -> every source without a
    key of its own is followed over CURVE (encrypted, authenticated). None: plain text."""
    curve_public_key: str | None = None
    """This subscriber's CURVE public key (Z85); None with a server key -> a fresh keypair."""
    curve_secret_key: str | None = field(default=None, repr=False)
    """SECRET: this subscriber's CURVE secret key (Z85), the pair of ``curve_public_key``."""

    def __post_init__(self) -> None:
        if (self.curve_public_key is None) != (self.curve_secret_key is None):
            raise ValueError("SubscriberConfig.curve_public_key and curve_secret_key go together (a keypair)")
        if not 0 < self.source_busy_share <= 1:
            raise ValueError(f"SubscriberConfig.source_busy_share must be in (0, 1] (seconds per second), "
                             f"got {self.source_busy_share}")
        for name in ("replay_timeout", "snapshot_timeout", "rcvhwm", "max_source_queue_bytes", "max_pending",
                     "max_pending_bytes", "reconnect_ivl_ms", "max_payload_bytes", "degraded_source_bytes_per_s",
                     "max_batch_blocks", "max_batch_events", "max_source_blocks", "bad_frame_threshold",
                     "bad_frame_window_s", "source_turn_s", "load_updates_per_s", "load_update_burst",
                     "recovery_backoff_s", "recovery_backoff_max_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SubscriberConfig.{name} must be positive, got {getattr(self, name)}")
        if not self.max_lag_s > 0:
            raise ValueError(f"events_max_lag_s must be positive seconds, got {self.max_lag_s}")
        if self.max_snapshot_bytes is not None and self.max_snapshot_bytes <= 0:
            raise ValueError(f"SubscriberConfig.max_snapshot_bytes must be positive (or None: sized by "
                             f"max_source_blocks), got {self.max_snapshot_bytes}")

    @property
    def max_message_bytes(self) -> int:
        """ZeroMQ's MAXMSGSIZE on every socket we read (bytes per frame; a bigger one drops the
        connection): twice ``max_payload_bytes``, so a payload somewhat over the limit is still
        read, counted and dropped by the guard rather than costing a reconnect."""
        return 2 * self.max_payload_bytes

    @property
    def max_connection_bytes(self) -> int:
        """Bytes a connection of ours may receive without delivering a whole message before it is cut
        off (events/subscribe/conn_bytes.py): its queue of whole messages (``max_source_queue_bytes``), one
        message under way and the kernel's receive buffer (``max_message_bytes`` each)."""
        return self.max_source_queue_bytes + 2 * self.max_message_bytes

    def snapshot_bytes(self) -> int:
        """The largest snapshot payload accepted: ``max_snapshot_bytes``, or 128 bytes per block of
        ``max_source_blocks`` (at least 128 MiB) when None."""
        if self.max_snapshot_bytes is not None:
            return self.max_snapshot_bytes
        return max(128 << 20, 128 * self.max_source_blocks)

    def queue_messages(self) -> int:
        """The receive high-water mark (messages) of every socket we read: ``rcvhwm``, lowered so
        that it times ``max_message_bytes`` stays within ``max_source_queue_bytes`` (at least 1)."""
        return max(1, min(self.rcvhwm, self.max_source_queue_bytes // self.max_message_bytes))
