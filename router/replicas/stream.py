"""One replica's event stream as the router watches and feeds it (``StreamState``), kept on its record: the stream
checks of router/control/stream_watch.py and the quarantine of router/control/event_feed.py read and write it."""

from __future__ import annotations


class StreamState:
    """One replica's event stream: how the stream checks see it (``StreamWatch``) and how the feed holds it."""

    __slots__ = ("behind", "clock_offset", "dropped_batches", "joined_after", "lag_s", "lagged_at", "lagging",
                 "lost_at", "lost_until_snapshot", "quarantined", "stalled", "stalled_by")

    def __init__(self) -> None:
        self.behind: tuple[int, float] | None = None
        """(reported seq, when first seen) of the oldest report the router has not caught up with."""
        self.clock_offset = 0.0
        """The replica's clock minus the router's (seconds), from its last ``/load``."""
        self.stalled = self.lagging = False
        self.lagged_at = 0.0
        """When (router's ``time.time()``) the last late batch was applied."""
        self.stalled_by: dict[str, str] = {}
        """What shows the stall ("report": ``/load``, "link": the connection) -> its reason."""
        self.lost_at: float | None = None
        self.lost_until_snapshot = False
        self.joined_after: int | None = None
        """The seq the replica reported before the router applied any batch of it: batches up to it
        were published before the router listened (it joined late) and are not owed."""
        self.quarantined = False
        """Degraded for bad frames: its batches are dropped until one starts afresh (event_feed.py)."""
        self.dropped_batches = 0
        """Batches dropped while it was quarantined."""
        self.lag_s: float | None = None
        """Seconds from its last batch's publishing to the router applying it (None: none yet)."""
