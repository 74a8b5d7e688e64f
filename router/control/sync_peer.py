"""One other router a router follows on the sync stream (router/control/router_sync.py): its SUB socket, its budget,
and the intake of what it sends.

``SyncPeer.read`` runs on the sync thread: it reads frames only while the peer's budget lasts (a ``TokenBucket`` of
``choices_per_s``; every choice costs one, every ``KEYS_PER_CHOICE`` block keys one more, a refused frame one), so a
turn overdraws it by one frame at most and a flood waits in ZeroMQ's queue. Each message is decoded and checked
(``sync_wire.check``): an undecodable frame is counted (``bad_frames``), a malformed message refused, counted and
logged once per peer; keys made under another seed are dropped and the bookings kept (``foreign_keys``).
"""

from __future__ import annotations

import logging

import msgspec
import zmq
from kvmesh.events.ratelimit import TokenBucket
from kvmesh.router.control.sync_wire import TOPIC, RouterChoice, check, decode_choices

__all__ = ["KEYS_PER_CHOICE", "SyncPeer"]

logger = logging.getLogger(__name__)

KEYS_PER_CHOICE = 64
"""Block keys that cost a peer's budget as much as one choice (a 1k-token prompt of 16-token blocks: one more), so
a peer's keys cost this router at most ``choices_per_s`` x this a second."""
_FRAMES_PER_TURN = 256
_NOBLOCK = int(zmq.NOBLOCK)


class SyncPeer:
    """One other router's stream: its SUB, its budget and what it sent (the sync thread's; counters read anywhere)."""

    __slots__ = ("endpoint", "sock", "budget", "choices", "bad_frames", "refused", "foreign_keys", "warned")

    def __init__(self, endpoint: str, sock: zmq.Socket, choices_per_s: float, burst: int) -> None:
        self.endpoint, self.sock = endpoint, sock
        self.budget = TokenBucket(choices_per_s, burst)
        self.choices = 0
        """Choices passed to the loop."""
        self.bad_frames = 0
        """Frames that are no message (undecodable, or not one frame after the topic)."""
        self.refused = 0
        """Messages refused at intake (``sync_wire.check``)."""
        self.foreign_keys = 0
        """Messages whose keys were made with another seed (``key_check``): their bookings count, their keys not."""
        self.warned = False

    def counters(self) -> dict[str, int]:
        return {"choices": self.choices, "bad_frames": self.bad_frames, "refused": self.refused,
                "foreign_keys": self.foreign_keys}

    def read(self, taken: list[tuple[str, RouterChoice]], key_check: int, max_keys: int) -> None:
        """Read what it sent (``_FRAMES_PER_TURN`` frames at most, within its budget) into ``taken`` as (its router
        id, choice); ``key_check``: this router's seed check; ``max_keys``: the most blocks a prompt has."""
        budget = self.budget
        for _ in range(_FRAMES_PER_TURN):
            if budget.wait_s(1.0) > 0:  # spent: the rest waits in ZeroMQ's queue (a frame's cost at most overdrawn)
                break
            try:
                frames = self.sock.recv_multipart(_NOBLOCK)
            except zmq.Again:
                break
            budget.spend(1.0)  # a message of one choice (the usual one) costs this alone
            if len(frames) != 2 or frames[0] != TOPIC:
                self.bad_frames += 1
                continue
            try:
                message = check(decode_choices(frames[1]), max_keys)
            except (msgspec.DecodeError, msgspec.ValidationError):
                self.bad_frames += 1
                continue
            except ValueError as e:
                self.refused += 1
                if not self.warned:
                    self.warned = True
                    logger.warning("router sync: %s sent a message this router refuses: %s (further refusals are "
                                   "counted, not logged)", self.endpoint, e)
                continue
            choices = message.choices
            if message.key_check != key_check and any(c.keys for c in choices):
                self.foreign_keys += 1
                choices = [RouterChoice(c.replica_id, c.booking, c.uncached_tokens, []) for c in choices]
            self.choices += len(choices)
            budget.spend(max(0, len(choices) - 1) + sum(len(c.keys) for c in choices) / KEYS_PER_CHOICE)
            taken.extend((message.router_id, choice) for choice in choices)
