"""Per-publisher counters kept by the subscriber."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class SourceStats:
    """Counters of one publisher as seen by a subscriber."""

    batches: int = 0
    """Batches delivered (a snapshot counts as one)."""
    events: int = 0
    """Events delivered."""
    gaps: int = 0
    """Times a seq jumped forward (messages lost)."""
    replays: int = 0
    """Replay requests answered."""
    snapshots: int = 0
    """Snapshots applied."""
    backoffs: int = 0
    """Replay/snapshot requests held back by the recovery back-off."""
    snapshot_failures: int = 0
    """Snapshot requests given up (no answer in time, or a source without snapshots)."""
    unrecovered: int = 0
    """Times a loss could not be repaired; the consumer was told (``on_status``)."""
    decode_errors: int = 0
    """Messages that could not be read (bad payload, frame count, seq frame)."""
    shape_refusals: int = 0
    """Payloads refused by their msgpack headers before any decoding (``events/peek.py``; counted in
    ``decode_errors`` too)."""
    rejected: int = 0
    """Batches dropped for breaking a limit (payload bytes, blocks per batch, blocks held)."""
    apply_errors: int = 0
    """Batches the consumer (``on_batch``) raised on; dropped."""
    bad_frames: int = 0
    """All dropped messages together: decode errors + rejected + apply errors."""
    degradations: int = 0
    """Times the source sent so many bad frames that it was degraded (see ``health.py``)."""
    over_budget: int = 0
    """Live messages of a degraded source dropped unread, over its decode budget
    (``SubscriberConfig.degraded_source_bytes_per_s``; counted in ``rejected`` too)."""
    busy_pauses: int = 0
    """Times the source was over its share of the I/O thread (``source_busy_share``): its socket left
    unread for a while (or, on a socket shared with other sources, one message dropped unread)."""
    covered_late: int = 0
    """Live batches a replay or snapshot had delivered that arrived after it (dropped; late_copies.py)."""
    pending_overflows: int = 0
    """Live batches dropped from the queue held during a recovery (over ``max_pending`` or
    ``max_pending_bytes``); recovered like lost ones."""
    unknown_events: int = 0
    """Events of unknown type dropped from otherwise good batches."""
    restarts: int = 0
    """Publisher restarts seen (seq went backwards, or AllBlocksCleared in the stream)."""
    reconnects: int = 0
    """Times the connection to the publisher dropped and came back."""
    late_joins: int = 0
    """Times the stream was joined under way from a source without replay endpoint: its first batch seen
    became the baseline (what it published before is unknown here; nothing is lost or degraded)."""
    last_seq: int = -1
    """Seq of the last delivered batch (-1: none yet)."""

    def as_dict(self) -> dict[str, int]:
        return asdict(self)
