"""A replica's own load, published on its event stream for routers: ``ReplicaLoadUpdate``.

It travels on the replica's replay socket (events/wire.py, ``LOAD_TAG``), never on the PUB socket: a ZeroMQ
subscription is a prefix and vLLM's consumers subscribe to the empty topic, which every topic starts with, so a
message on the PUB socket under any topic would reach them. A router asks for it (``LOAD_REQUEST``) and gets the
latest update at once, then every later one for ``LOAD_LEASE_S`` after its last request; it asks again well
within that, so a router that stopped costs the replica nothing after the lease. A plain vLLM subscriber never
asks and never sees one; the CURVE keys of a private stream cover the replay socket, and so these updates.

A replica publishes at once when it accepts a request (every router then counts it one network hop later), and
when its engine steps changed its load at most once per interval (``EventsConfig.load_interval_s``), so a router's
view lags the replica by the network for what it accepted, and by one interval plus the network for its progress.

A router orders a replica's updates by ``(epoch, seq)``, never by ``ts``, and checks each one at intake
(events/load_check.py) before it applies it.
"""

from __future__ import annotations

import secrets

import msgspec

__all__ = ["LOAD_LEASE_S", "ReplicaLoadUpdate", "decode_load_update", "encode_load_update", "new_epoch"]

LOAD_LEASE_S = 10.0
"""Seconds a load request keeps its asker on the replica's list of load subscribers."""


class ReplicaLoadUpdate(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, forbid_unknown_fields=False):
    """One replica's load as of ``ts``; the msgpack array ``[ts, seq, running, waiting, ...]`` on the wire."""

    ts: float
    """Wall-clock time (seconds since the epoch) the load was read: information only, never an order (a replica's
    clock may step)."""
    seq: int
    """Updates published before this one in its ``epoch`` (from 0): within an epoch, a lower seq is an older
    update."""
    num_running: int
    """Requests running (scheduled in the engine's batch)."""
    num_waiting: int
    """Requests waiting for a batch slot."""
    queued_prefill_tokens: int
    """Prompt tokens the replica still has to prefill (uncached, not computed yet)."""
    kv_usage: float
    """Fraction of its KV cache blocks in use."""
    accepted: dict[str, int]
    """Router id -> the highest booking number (router/replicas/bookings.py) it accepted from that router: the
    requests of that router it counts above."""
    prefill_tokens_per_s: float | None = None
    """Prompt tokens per second it measured itself computing (None: not measured yet)."""
    decode_step_s: float | None = None
    """Seconds a decode step takes besides its sequences, as measured (``/load``'s ``decode_step.step_s``; None:
    not measured yet)."""
    engine_steps: int = 0
    """Decode steps it measured since it started (what the load is as of)."""
    arrival_rate: float = 0.0
    """Requests per second it accepted, from every router, exponentially decayed over 30 s."""
    recent_prefill: float = 0.0
    """Uncached prompt tokens of the requests it accepted, exponentially decayed over ``churn_tau_s`` to ``ts``:
    how fast its cache turns over."""
    recent_prompt: float = 0.0
    """Their prompt tokens, decayed alike (``1 - recent_prefill / recent_prompt``: its recent hit fraction)."""
    recent_requests: float = 0.0
    """Requests it accepted, decayed alike."""
    churn_tau_s: float = 0.0
    """Time constant of the three decayed sums (0: not published)."""
    epoch: int = 0
    """A random id the publisher chose when it started (1 to 2**63 - 1; 0: a publisher that names none): an update of
    another epoch than the last is a restarted replica's, and replaces what came before."""


def new_epoch() -> int:
    """A publisher's epoch id: random, so a restarted replica's updates never read as its old run's."""
    return secrets.randbits(63) or 1


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(ReplicaLoadUpdate)


def encode_load_update(update: ReplicaLoadUpdate) -> bytes:
    """The msgpack payload of ``update``."""
    return _ENCODER.encode(update)


def decode_load_update(payload: bytes) -> ReplicaLoadUpdate:
    """Inverse of ``encode_load_update``; raises ``msgspec.DecodeError``/``ValidationError`` on a bad payload
    (fields added after the last known one are ignored, so an older router reads a newer replica)."""
    return _DECODER.decode(payload)
