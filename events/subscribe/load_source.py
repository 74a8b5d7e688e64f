"""One replica the load feed follows (events/subscribe/load_feed.py): its DEALER, what it may cost, what it sent.

A source's frames are taken in turns: every pending frame is read (at most ``MAX_FRAMES_PER_TURN``: a peer's
queue holds no more, ``LOAD_RCVHWM``), only the newest load frame of the turn is decoded and checked (an update is
a whole load: an older one in the same turn says nothing the newest does not), and at most
``load_updates_per_s`` updates a second are taken from it (every ``FRAMES_PER_UPDATE`` frames read count as one
more). A source beyond that is not read until its bucket refilled: its flood waits in ZeroMQ's queue and then in its own
publisher, and costs this process nothing more.
"""

from __future__ import annotations

import zmq
from kvmesh.events.ratelimit import TokenBucket

__all__ = ["FRAMES_PER_UPDATE", "LOAD_RCVHWM", "LoadSource", "MAX_FRAMES_PER_TURN"]

LOAD_RCVHWM = 64
"""Messages ZeroMQ queues for one load DEALER (beyond it the publisher's ROUTER drops what it sends there)."""
MAX_FRAMES_PER_TURN = 2 * LOAD_RCVHWM
"""Frames read from one source per turn of the feed's loop."""
FRAMES_PER_UPDATE = 8
"""Frames read that cost a source as much of its budget as one update decoded (so a flood of frames that are no
update, or that a newer one superseded, is paced too)."""


class LoadSource:
    """A followed replica's socket, its update budget and its counters (the feed's thread only; counters are ints,
    read by any thread)."""

    __slots__ = ("name", "sock", "budget", "asked", "absent", "warned", "updates", "refused", "throttled",
                 "bad_frames")

    def __init__(self, name: str, sock: zmq.Socket, updates_per_s: float, burst: int) -> None:
        self.name, self.sock = name, sock
        self.budget = TokenBucket(updates_per_s, burst)
        self.asked: float | None = None
        """When it was last asked for its load (``time.monotonic()``; None: not yet)."""
        self.absent = False
        """It answered a load request with a replay end marker (a vLLM publisher): said once."""
        self.warned = False
        """A refused update of it was logged (once per source)."""
        self.updates = 0
        """Updates passed on."""
        self.refused = 0
        """Updates refused at intake (malformed: events/load_check.py)."""
        self.throttled = 0
        """Load frames read and dropped undecoded: another of the same turn was newer."""
        self.bad_frames = 0
        """Frames that are no load update, or undecodable."""

    def counters(self) -> dict[str, int]:
        return {"updates": self.updates, "refused": self.refused, "throttled": self.throttled,
                "bad_frames": self.bad_frames}

    def wait_s(self) -> float:
        """Seconds until it may pass on an update again (0.0: now)."""
        return self.budget.wait_s(1.0)
