"""One replica's load as the router sees it (``ReplicaLoad``): its own in-flight requests plus the replica's ``/load``.

The record lives on the replica (router/replicas/replica.py); ``LoadTracker`` (router/routing/load.py) keeps its
counters exact and shares them between router processes.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
from kvmesh.events.load import ReplicaLoadUpdate
from kvmesh.replica.serving.load_report import DecodeStepLoad, KVLayoutInfo, LoadReport, LoRALoad
from kvmesh.router.replicas.advertised_layout import read_layout
from kvmesh.router.replicas.bookings import Bookings, PeerBookings
from kvmesh.router.replicas.foreign_load import ForeignLoad, foreign_counts

PUBLISHED_FRESH_S = 2.0
"""Seconds a replica's published load is taken over its ``/load`` polls (a replica publishes at least every few
milliseconds while it has requests, and once a second or so when idle: older, its stream stopped)."""

RETIRED_EPOCHS = 4
"""Replaced epochs of one replica remembered, so a late update of a run before its restart is not taken."""

@dataclass(slots=True, kw_only=True)
class ReplicaLoad:
    """Load of one replica. Policies read ``prefill_backlog`` and ``decode_load``; ``kvmesh status``
    shows it (``ReplicaStatus``, cluster/router_client.py, read back from the router's metrics)."""

    in_flight: int = 0
    """Requests this router sent to the replica that have not finished."""
    pending_prefill_tokens: int = 0
    """Uncached prompt tokens of this router's requests that have produced no output yet."""
    held_prefill_tokens: int = 0
    """Uncached prompt tokens of the requests this router's admission holds for the replica (waiting in the router
    for it: router/http/held_load.py); counted in ``prefill_backlog`` as the queue they will be there."""
    held_requests: int = 0
    """Those requests (counted in ``decode_load``)."""
    num_running: int = 0
    """Running requests, as the replica last reported."""
    num_waiting: int = 0
    """Waiting (queued) requests, as the replica last reported."""
    kv_usage: float = 0.0
    """Fraction of the replica's KV cache blocks in use, as last reported."""
    queued_prefill_tokens: int = 0
    """Prompt tokens the replica still has to prefill, as last reported."""
    reported_at: float | None = None
    """``time.monotonic()`` of the last report; None before the first one."""
    recent_prefill: float = 0.0
    """Uncached prompt tokens this router sent here, exponentially decayed (``LoadTracker.churn_tau_s``):
    how fast the replica's cache turns over. In the tracker's scaled units: compare replicas only."""
    comeback: float = 0.0
    """Share of the blocks the replica stored lately that it had evicted before (from its KV events:
    router/routing/eviction_ghosts.py): how much reuse its cache is too small to keep."""
    stored_blocks: int = 0
    """Device blocks its KV events stored (the blocks ``comeback`` is taken over)."""
    came_back_blocks: int = 0
    """Of ``stored_blocks``, those that came back after an eviction (on it or another replica)."""
    other_routers: int = 0
    """Routers besides this one whose requests the replica's last published load says it accepted (its ``accepted``):
    0 for a router alone. Such routers decide on the same load without seeing each other's latest choices."""
    evicting: float = 0.0
    """Share of the device blocks the replica stored lately that evicted a cached block (from its KV events:
    router/routing/evicting.py): 0 while its cache fills, about 1 once every store pushes a block out."""
    evict_sums: list[float] = field(default_factory=lambda: [0.0, 0.0])
    """``evicting``'s decayed sums: [blocks stored, blocks removed] (a list: updating it marks no row stale)."""
    landing_pulls: int = 0
    """This router's requests sent here with a peer pull still landing, by its priced seconds: each joins the
    replica's queue when its pull lands, behind a request sent meanwhile (router/routing/pulls_landing.py)."""
    evicted: OrderedDict[object, None] = field(default_factory=OrderedDict)
    """Its ghost list: the device blocks it evicted lately (external hashes -> None), the oldest first, one cache deep
    (router/routing/eviction_ghosts.py; kept only for a policy that prices comeback)."""

    prefill_tokens_per_s: float | None = None
    """Prompt tokens per second the replica measured itself computing (None: not reported)."""
    kv_block_bytes: int | None = None
    """Bytes one KV block moves on a load-back, as reported (None: not reported)."""
    h2d_bytes_per_s: float | None = None
    """Host-to-device bandwidth the replica measured for its host tier (None: no tier or not reported)."""
    num_host_kv_blocks: int = 0
    """Blocks of the replica's host-memory tier, as reported (0: none)."""
    num_kv_blocks: int = 0
    """Blocks of the replica's KV cache, its null block included, as reported (0: not reported)."""
    host_kv_usage: float = 0.0
    """Fraction of the host tier holding content, as reported."""
    kv_transfer_enabled: bool = False
    """The replica reported KV transfer on (``/load``'s ``kv_transfer.enabled``): it can pull and be pulled from."""
    pull_bytes_per_s: float | None = None
    """Bytes per second its pulls from peers measured (``kv_transfer.pull_bytes_per_s``, an EWMA; None: none yet)."""
    kv_bytes_per_token: int | None = None
    """KV bytes one token moves in a pull (``kv_transfer.bytes_per_token``; None: not reported)."""
    kv_layout: KVLayoutInfo | None = None
    """What a peer's KV must match to move to or from it (``kv_transfer.layout``: router/replicas/
    advertised_layout.py); None: transfer off, or a load never read from a ``/load`` (the simulator's: all alike)."""
    kv_layout_problem: str | None = None
    """Why its advertised layout is unusable (missing, malformed, oversized): it is paired with no replica and its
    transfer counts as off; None: no problem."""

    decode_step: DecodeStepLoad | None = None
    """The replica's measured decode step time and running context (``/load``'s ``decode_step``; None: none)."""
    pull_fixed_s: float | None = None
    """Seconds a pull costs besides its bytes, as measured (``kv_transfer.pull_fixed_s``; None: not yet)."""
    lora: LoRALoad | None = None
    """Its adapters: sizes, which are resident, its load rate (``/load``'s ``lora``; None: not reported)."""
    max_num_seqs: int | None = None
    """Most requests it runs at once, as it reports (``/load``'s ``max_num_seqs``; None: not reported)."""
    scheduling_policy: str | None = None
    """Its engine's scheduling policy, as it reports (``/load``'s ``scheduling_policy``; None: not said, e.g. vLLM):
    only under ``priority`` do requests to it carry the priority the router granted (router/http/caller.py)."""
    ttft_correction: float = 1.0
    """The scale of observed over predicted TTFT here, learned online (router/routing/cost/correction.py)."""
    ttft_offset_s: float = 0.0
    """Seconds observed TTFTs here take beyond the scaled prediction (the same fit's offset)."""
    ttft_sums: list[float] = field(default_factory=list)
    """That fit's decayed sums (weight, x, y, xx, xy); empty before the first observation."""
    recent_prompt: float = 0.0
    """Prompt tokens this router sent here, decayed as ``recent_prefill`` (same units): ``1 - recent_prefill /
    recent_prompt`` is the replica's recent hit fraction."""
    recent_requests: float = 0.0
    """Requests this router sent here, decayed as ``recent_prefill`` (``recent_prompt / recent_requests``: their
    mean prompt, a running request's context when the replica reports none)."""
    arrival_rate: float = 0.0
    """Requests per second this router sends here, exponentially decayed over ``ARRIVAL_TAU_S`` (as of the last)."""
    last_dispatch: float | None = None
    """The clock of the last request sent here (``LoadTracker.on_dispatch``'s ``now``)."""

    peer_in_flight: int = 0
    """Requests the other router processes of this host sent here and have not finished (shared
    table, as of ``LoadTracker.refresh``; 0 for a router alone)."""
    peer_pending_prefill_tokens: int = 0
    """Their uncached prompt tokens that have produced no output yet (idem)."""
    unacked_requests: int = 0
    """Requests of this router (and of the routers it syncs with) sent here that the replica's last published load
    does not count yet (router/replicas/bookings.py; 0 when the replica does not publish its load)."""
    unacked_prefill_tokens: int = 0
    """Their uncached prompt tokens."""
    bookings: Bookings | None = None
    """This router's requests sent here that the replica has not acknowledged yet (replicas/bookings.py); None
    while the replica publishes no load."""
    peer_bookings: dict[str, PeerBookings] = field(default_factory=dict)
    """Other routers' requests sent here that the replica has not acknowledged yet, by their router ids, as their
    choices reached this router (router/control/router_sync.py; empty without routers to sync with). Counted in
    ``unacked_*`` beside this router's own."""
    published_seq: int | None = None
    """``seq`` of the last load the replica published (events/load.py) that this router applied; None: none yet
    (the replica's load comes from ``/load`` polls)."""
    published_epoch: int = 0
    """Its ``epoch`` (a restarted replica numbers its updates from 0 again, in a new epoch)."""
    retired_epochs: tuple[int, ...] = ()
    """The epochs a newer one replaced, the latest last (``RETIRED_EPOCHS`` kept): a late update of one is refused."""
    published_accepted: dict[str, int] = field(default_factory=dict)
    """Its ``accepted``: per router id, the highest booking number the replica had accepted from it (a booking of
    another router that reaches this one later is counted there already: ``LoadTracker.peer_booked``)."""
    published_ts: float = 0.0
    """Its ``ts`` (the replica's wall clock: shown, never an order)."""
    published_at: float = 0.0
    """When this router applied it (``time.monotonic()``, or the clock ``apply_published`` was given)."""
    watcher: Callable[[], None] | None = field(default=None, repr=False, compare=False)
    """Called after any field is set (the tracker's columns re-read this replica before the next decision,
    router/routing/cost/load_columns.py); None: nothing watches it."""
    row: int | None = field(default=None, repr=False, compare=False)
    """Where the watcher keeps this load: its row in the load columns (None: in none yet)."""
    shared_slot: int | None = field(default=None, repr=False, compare=False)
    """Its column in the host's shared load table (router/routing/shared_loads.py; None: not shared, or the table
    is full)."""

    def watch(self, watcher: Callable[[], None] | None, row: int | None = None) -> None:
        """Call ``watcher`` after any field is set from now on (setting it calls nothing: the watcher's owner, which
        reads the fields next, is not called back); ``row``: where the watcher keeps this load."""
        object.__setattr__(self, "watcher", watcher)
        object.__setattr__(self, "row", row)

    def __setattr__(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)
        try:
            watcher = self.watcher
        except AttributeError:  # still in __init__: nothing watches it yet
            return
        if watcher is not None:
            watcher()

    @property
    def prefill_backlog(self) -> int:
        """Prompt tokens the replica must prefill before a new request's own prefill starts."""
        return max(self.pending_prefill_tokens + self.peer_pending_prefill_tokens,
                   self.queued_prefill_tokens + self.unacked_prefill_tokens) + self.held_prefill_tokens

    @property
    def decode_load(self) -> int:
        """Requests sharing the replica's decode steps."""
        return max(self.in_flight + self.peer_in_flight,
                   self.num_running + self.num_waiting + self.unacked_requests) + self.held_requests

    @property
    def prompt_per_kv_block(self) -> float:
        """The mean prompt of this router's recent requests here, in tokens, over the blocks of the replica's KV
        cache: times ``decode_load`` and over the block size, how many times over its requests would fill its cache
        (0: no cache size reported, or no request sent yet)."""
        if not self.num_kv_blocks or self.recent_requests <= 0:
            return 0.0
        return self.recent_prompt / self.recent_requests / self.num_kv_blocks

    def load_back_s(self, num_blocks: int) -> float:
        """Seconds to load ``num_blocks`` back from the host tier (0 when the replica reported no bandwidth)."""
        return copy_seconds(num_blocks, self.kv_block_bytes, self.h2d_bytes_per_s) or 0.0

    def pull_s(self, num_blocks: int, block_size: int, overhead_s: float,
               assumed_bytes_per_s: float | None = None) -> float | None:
        """Seconds for this replica to pull ``num_blocks`` from a peer: the copy at its measured pull rate
        (``assumed_bytes_per_s`` until it measured one) plus ``overhead_s`` per pull (lease, handshake,
        release); None when it cannot be priced (no block size in bytes, no rate)."""
        block_bytes = self.kv_block_bytes or (self.kv_bytes_per_token * block_size if self.kv_bytes_per_token else None)
        seconds = copy_seconds(num_blocks, block_bytes, self.pull_bytes_per_s or assumed_bytes_per_s)
        return None if seconds is None else seconds + overhead_s

    def update_transfer(self, kv_transfer: object) -> None:
        """Take ``/load``'s ``kv_transfer`` object (a dict, or a Struct with the same fields); None/absent:
        transfer off, as it is when its layout is unusable (``kv_layout_problem``)."""
        fields = kv_transfer if isinstance(kv_transfer, dict) else msgspec.structs.asdict(kv_transfer) \
            if isinstance(kv_transfer, msgspec.Struct) else {}
        get = fields.get
        enabled = kv_transfer is not None and get("enabled") is True
        self.kv_layout, self.kv_layout_problem = read_layout(get("layout")) if enabled else (None, None)
        self.kv_transfer_enabled = enabled and self.kv_layout_problem is None  # an unknown layout is paired with none
        rate, per_token, fixed = get("pull_bytes_per_s"), get("bytes_per_token"), get("pull_fixed_s")
        self.pull_bytes_per_s = float(rate) if isinstance(rate, (int, float)) and rate > 0 else None
        self.pull_fixed_s = float(fixed) if isinstance(fixed, (int, float)) and fixed >= 0 else None
        self.kv_bytes_per_token = per_token if isinstance(per_token, int) and per_token > 0 else None

    @property
    def total_in_flight(self) -> int:
        """Requests all router processes of this host sent here that have not finished."""
        return self.in_flight + self.peer_in_flight

    def apply_published(self, update: ReplicaLoadUpdate, now: float | None = None) -> bool:
        """Take the load the replica published (events/load.py); False (nothing taken) when it is not newer than the
        last one applied: within its epoch by ``seq`` (never by ``ts``, a clock that may step); an update of another
        epoch is a restarted replica's and replaces the last, unless a restart already replaced its epoch. The caller
        sets ``unacked_*`` from its bookings."""
        if self.published_seq is not None:
            if update.epoch == self.published_epoch:
                if update.seq <= self.published_seq:
                    return False
            elif update.epoch in self.retired_epochs:
                return False
            else:
                self.retired_epochs = (*self.retired_epochs, self.published_epoch)[-RETIRED_EPOCHS:]
        self.published_seq, self.published_epoch, self.published_ts = update.seq, update.epoch, update.ts
        self.published_accepted = update.accepted
        self.published_at = time.monotonic() if now is None else now
        self.num_running, self.num_waiting = update.num_running, update.num_waiting
        self.kv_usage, self.queued_prefill_tokens = update.kv_usage, update.queued_prefill_tokens
        if update.prefill_tokens_per_s is not None:
            self.prefill_tokens_per_s = update.prefill_tokens_per_s
        self.reported_at = time.monotonic()
        return True

    def update_report(self, report: LoadReport | ForeignLoad, now: float | None = None) -> None:
        """Take a replica's ``/load``: kvmesh's ``LoadReport`` (its counts only while the replica publishes no load
        of its own, ``apply_published``), or another server's JSON in a few other spellings (unknown keys are
        ignored; missing ones keep their value); ``now``: the clock of ``apply_published``, ``time.monotonic()``
        when None."""
        if isinstance(report, LoadReport):
            now = time.monotonic() if now is None else now
            if self.published_seq is None or now - self.published_at > PUBLISHED_FRESH_S:
                self.num_running, self.num_waiting = report.num_requests_running, report.num_requests_waiting
                self.kv_usage, self.queued_prefill_tokens = report.kv_cache_usage, report.num_waiting_prefill_tokens
            self.prefill_tokens_per_s, self.kv_block_bytes = report.prefill_tokens_per_s, report.kv_block_bytes
            self.h2d_bytes_per_s, self.num_host_kv_blocks = report.h2d_bytes_per_s, report.num_host_kv_blocks
            self.host_kv_usage, self.decode_step = report.host_kv_cache_usage, report.decode_step
            self.lora = report.lora
            self.max_num_seqs, self.scheduling_policy = report.max_num_seqs, report.scheduling_policy
            self.num_kv_blocks = report.num_kv_blocks
            self.reported_at = time.monotonic()
            return
        self.num_running, self.num_waiting, self.kv_usage, self.queued_prefill_tokens = foreign_counts(
            report, self.num_running, self.num_waiting, self.kv_usage, self.queued_prefill_tokens)
        self.reported_at = time.monotonic()


def copy_seconds(num_blocks: int, block_bytes: int | None, bytes_per_s: float | None) -> float | None:
    """Seconds to move ``num_blocks`` KV blocks of ``block_bytes`` at ``bytes_per_s``: the one cost form of a
    host-tier load-back and a peer pull (0 for no blocks; None when a size or the rate is unknown)."""
    if not num_blocks:
        return 0.0
    if not block_bytes or not bytes_per_s:
        return None
    return num_blocks * block_bytes / bytes_per_s

