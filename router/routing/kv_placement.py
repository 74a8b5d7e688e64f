"""When KV moves between replicas: the prefill/decode split and peer pulls, decided without I/O.

**Split.** The decode replica is chosen first (the policy, as for any request). A prompt whose uncached suffix on
it is under ``pd_min_uncached_tokens`` stays whole. A longer one is priced in seconds (``price_split``) on every
healthy prefill replica whose prefill backlog is under ``pd_max_prefill_backlog_tokens`` (a hard bound; none:
``skipped_no_room``)::

    split_s = (prefill's backlog + the prompt's tokens uncached there) / prefill's prefill_tokens_per_s
              + moving what the decode replica lacks (ReplicaLoad.pull_s, the host tier's copy_seconds form)
    local_s = (decode's backlog + the uncached suffix) / decode's prefill_tokens_per_s
    stall_s = requests decoding on the decode replica * the suffix's prefill seconds there

and goes to the prefill replica with the smallest ``split_s`` when what it costs the prompt's time to first token
is within what it may::

    split_s - local_s <= pd_ttft_slack_s + pd_stall_weight * stall_s

else it stays whole (``skipped_slower``). A prefill replica whose KV layout differs from the decode replica's (the
dtype, FP8 scales, attention layout, TP size: router/replicas/kv_share.py) is never a candidate; when none is left,
the prompt stays whole (``skipped_layout``) and the route receipt says why.

A split trades the prompt's first token for the decode batch's next ones: it is worth a fixed allowance (a round
trip and a move, so an idle decode replica still hands long prompts off) plus the stall it takes off the batch,
never a prefill queue that costs more than that (on a prefill-bound trace the token rules sent prompts to such
queues; a slack *factor* on ``local_s``, tried there, refused the cheap splits of short local prefills). A replica
without a measured prefill rate (or a pull that cannot be priced), or ``pd_ttft_slack_s`` None, leaves the token
rules: the least loaded prefill replica with room.

**Peer pull.** When the policy (any policy) sends a request away from the replica holding the most of its prefix
(load), the chosen replica can pull the holder's extra blocks instead of computing them (``price_pull``). A holder's
blocks are those its events confirmed: one credited to it for a request still queued there is not there yet, and a
pull of it would move nothing::

    pull_s      = extra blocks * bytes per block / chosen's pull_bytes_per_s + peer_pull_overhead_s
    recompute_s = extra blocks * block_size / chosen's prefill_tokens_per_s

priced with ``ReplicaLoad.pull_s`` (the host tier's load-back form, ``load.copy_seconds``). A pull is planned
only when ``pull_s < recompute_s`` and both replicas report ``kv_transfer.enabled`` in ``/load`` with the same
KV layout (``kv_transfer.layout``, router/replicas/kv_share.py). A replica
that has not measured a pull yet is priced at ``peer_pull_assumed_bytes_per_s``; one without a prefill rate at
the mean of those reported (none anywhere: no pull, it cannot be priced).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from kvmesh.kvcache.reuse import reusable_blocks
from kvmesh.router.replicas.kv_share import share_refusal
from kvmesh.router.replicas.load import ReplicaLoad
from kvmesh.router.replicas.replica import Replica, ReplicaId
from kvmesh.router.routing.cost import (
    FleetRates,
    PullPriors,
    can_pull,
    estimate,
    prefill_s_per_token,
    pull_seconds,
)

DEFAULT_STEP_TOKENS = 8192.0
"""A step budget for the split's price (the decode replica's steps interleaved with the suffix's prefill)."""

SPLIT_OK, SPLIT_PREFILL_FAILED = "ok", "prefill_failed"
SPLIT_NO_ROOM, SPLIT_SLOWER = "skipped_no_room", "skipped_slower"
SPLIT_LAYOUT = "skipped_layout"
SPLIT_OUTCOMES = (SPLIT_OK, SPLIT_PREFILL_FAILED, SPLIT_NO_ROOM, SPLIT_SLOWER, SPLIT_LAYOUT)
"""``kvmesh_router_pd_splits_total{outcome}``: split done, prefill call failed (the decode replica computed the
prompt), split wanted but no prefill replica had room, split priced slower than ``pd_ttft_slack`` allows, split
wanted but no prefill replica shares the decode replica's KV layout (router/replicas/kv_share.py)."""


@dataclass(frozen=True, slots=True)
class KVPlacementRules:
    """The router's settings for moving KV: its config section ``RouterConfig.transfers``, handed whole to the
    router (flags and variables keep their flat names: ``--pd-min-uncached-tokens``, ``--peer-pulls``)."""

    pd_min_uncached_tokens: int = 256
    """Prefill/decode split: a prompt with at least this many tokens uncached on its decode replica is prefilled
    on a prefill replica (role=prefill) first, when one has room and the split is worth its seconds (pd_ttft_slack_s);
    shorter ones are served whole."""
    pd_max_prefill_backlog_tokens: int = 16384
    """A prefill replica has room for a split while the prompt tokens queued on it are fewer than this (a hard
    bound)."""
    pd_ttft_slack_s: float | None = 0.5
    """A split goes ahead when what it adds to the prompt's time to first token (the prefill replica's queue and
    prefill at its measured rate plus moving the KV, against the decode replica's queue and the uncached suffix)
    is at most these seconds plus pd_stall_weight times the stall it saves the decode batch; None, or a rate not
    measured yet: the token rules alone (router/routing/kv_placement.py)."""
    pd_stall_weight: float = 1.0
    """Seconds of time to first token a split may cost per second of stall it saves the decode replica's batch
    (the suffix's prefill seconds there, times the requests decoding there); 0: pd_ttft_slack_s alone."""
    peer_pulls: bool = True
    """Ask a replica to pull a prompt's prefix from the replica holding it when the pull costs fewer seconds than
    recomputing (both must report kv_transfer enabled in /load)."""
    peer_pull_overhead_s: float = 0.01
    """Seconds one pull costs besides the copy itself (lease, handshake and release round trips)."""
    peer_pull_assumed_bytes_per_s: float = 1e9
    """Pull bandwidth (bytes/s) assumed for a replica that has not measured one yet; 0: no pull until it has."""

    def __post_init__(self) -> None:
        if self.pd_min_uncached_tokens < 1 or self.pd_max_prefill_backlog_tokens < 1:
            raise ValueError("pd_min_uncached_tokens and pd_max_prefill_backlog_tokens must be >= 1 token, got "
                             f"{self.pd_min_uncached_tokens} and {self.pd_max_prefill_backlog_tokens}")
        if not ((self.pd_ttft_slack_s is None or self.pd_ttft_slack_s >= 0) and self.pd_stall_weight >= 0):
            raise ValueError("pd_ttft_slack_s (seconds, or None for the token rules alone) and pd_stall_weight must "
                             f"be >= 0, got {self.pd_ttft_slack_s} and {self.pd_stall_weight}")
        if not (self.peer_pull_overhead_s >= 0 and self.peer_pull_assumed_bytes_per_s >= 0):
            raise ValueError("peer_pull_overhead_s and peer_pull_assumed_bytes_per_s must be >= 0, got "
                             f"{self.peer_pull_overhead_s} and {self.peer_pull_assumed_bytes_per_s}")


@dataclass(frozen=True, slots=True)
class PlannedPull:
    """A peer pull the router asks the chosen replica to make (``kv_transfer_params.remote_url`` = the holder's)."""

    holder: Replica
    """The replica holding the prefix."""
    num_tokens: int
    """Prompt tokens the pull should move (the holder's extra full blocks)."""
    pull_s: float
    """Its price in seconds."""
    recompute_s: float
    """What computing them instead would cost in seconds."""


@dataclass(frozen=True, slots=True)
class SplitChoice:
    """Where a long prompt is prefilled (``choose_split``)."""

    prefill: Replica | None
    """The prefill replica; None: the prompt stays whole on its decode replica."""
    skipped: str | None = None
    """Why a wanted split was not made (``SPLIT_NO_ROOM``, ``SPLIT_SLOWER``, ``SPLIT_LAYOUT``); None when made or not
    wanted."""
    price: SplitPrice | None = None
    """The best prefill replica's price in seconds (None: not priced, the token rules decided)."""
    why: str | None = None
    """With ``SPLIT_LAYOUT``: why no prefill replica may hand its KV to the decode replica (the route receipt's
    ``kv_not_shared``)."""


@dataclass(frozen=True, slots=True)
class SplitPrice:
    """A split's price in seconds (``price_split``)."""

    split_s: float
    """Expected seconds to the first token via the prefill replica: its queue, its prefill, the move."""
    local_s: float
    """Expected seconds to the first token computing the prompt on the decode replica: its queue, the suffix."""
    stall_s: float
    """Seconds of stall the suffix would put on the decode replica's batch (summed over its decoding requests)."""

    def worth_it(self, rules: KVPlacementRules) -> bool:
        """The split costs the prompt no more time to first token than it may (the module doc)."""
        return self.split_s - self.local_s <= rules.pd_ttft_slack_s + rules.pd_stall_weight * self.stall_s


def choose_prefill(prefill: Sequence[Replica], rules: KVPlacementRules) -> Replica | None:
    """The token rule: the least loaded healthy prefill replica with room (backlog, then requests in flight;
    ``prefill``: the prefill replicas, in the set's order); None: none has room."""
    best, best_key = None, None
    for replica in _with_room(prefill, rules):
        load = replica.load
        key = (load.prefill_backlog, load.total_in_flight)
        if best_key is None or key < best_key:
            best, best_key = replica, key
    return best


def _with_room(prefill: Sequence[Replica], rules: KVPlacementRules) -> list[Replica]:
    """Healthy prefill replicas whose backlog is under the hard bound ``pd_max_prefill_backlog_tokens``."""
    bound = rules.pd_max_prefill_backlog_tokens
    return [r for r in prefill if r.healthy and r.load.prefill_backlog < bound]


def price_split(decode: ReplicaLoad, prefill: ReplicaLoad, local_uncached: int, prefill_uncached: int,
                move_blocks: int, block_size: int, rules: KVPlacementRules,
                fleet: FleetRates | None = None) -> SplitPrice | None:
    """The split via ``prefill`` (computing ``prefill_uncached`` tokens, the decode replica pulling
    ``move_blocks``) against ``decode`` computing ``local_uncached``, both priced by the router's cost model
    (router/routing/cost/); None when either replica has no measured prefill rate or the move cannot be priced."""
    fleet = FleetRates.of((decode, prefill)) if fleet is None else fleet
    if decode.prefill_tokens_per_s is None or prefill.prefill_tokens_per_s is None:
        return None
    move_s = pull_seconds(decode, fleet, move_blocks, block_size, pull_priors(rules))
    if move_s is None:
        return None
    step = DEFAULT_STEP_TOKENS
    there = estimate(prefill, fleet, prefill_uncached, prefill_uncached, 0, block_size, step)
    here = estimate(decode, fleet, local_uncached, local_uncached, 0, block_size, step)
    return SplitPrice(there.ttft_s + move_s, here.ttft_s, here.stall_s)


def choose_split(prefill: Sequence[Replica], decode: Replica,
                 local_uncached: int, prefill_matched: Mapping[ReplicaId, int], num_prompt_tokens: int,
                 block_size: int, rules: KVPlacementRules) -> SplitChoice:
    """The split decision for a prompt whose uncached suffix on ``decode`` is ``local_uncached`` tokens
    (``prefill``: the prefill replicas, in the set's order; ``prefill_matched``: leading prompt blocks each holds,
    by id as the index answers). See the module doc."""
    if local_uncached < rules.pd_min_uncached_tokens:
        return SplitChoice(None)
    healthy = [p for p in prefill if p.healthy]
    refusals = [share_refusal(decode, p) for p in healthy]
    if healthy and all(refusals):  # the decode replica's handshake would refuse each of them
        return SplitChoice(None, SPLIT_LAYOUT, why=refusals[0])
    prefill = [p for p, refused in zip(healthy, refusals, strict=True) if not refused]
    room = _with_room(prefill, rules)
    if not room:
        return SplitChoice(None, SPLIT_NO_ROOM)
    usable = reusable_blocks(num_prompt_tokens, block_size)  # full blocks a replica reuses
    lacking = max(0, usable - (num_prompt_tokens - local_uncached) // block_size)
    # None: the token rules alone
    prices: list[tuple[SplitPrice, Replica]] | None = [] if rules.pd_ttft_slack_s is not None else None
    for replica in room if prices is not None else ():
        held = min(prefill_matched.get(replica.id, 0), usable) * block_size
        price = price_split(decode.load, replica.load, local_uncached, num_prompt_tokens - held, lacking,
                            block_size, rules)
        if price is None:  # a rate not measured yet: the token rules
            prices = None
            break
        prices.append((price, replica))
    if not prices:
        return SplitChoice(choose_prefill(prefill, rules))
    price, best = min(prices, key=lambda p: p[0].split_s)
    return SplitChoice(best, None, price) if price.worth_it(rules) else SplitChoice(None, SPLIT_SLOWER, price)


def tokens_left_after_split(num_prompt_tokens: int, block_size: int) -> int:
    """Prompt tokens a split's decode replica still computes once it pulled the prompt's full blocks (all but the
    last token reuse): what its load counts as prefill for the request, instead of the uncached suffix."""
    return num_prompt_tokens - reusable_blocks(num_prompt_tokens, block_size) * block_size


def pull_priors(rules: KVPlacementRules) -> PullPriors:
    """The cost model's pull priors from this section (a fleet that measured no pull yet)."""
    return PullPriors(rules.peer_pulls, rules.peer_pull_assumed_bytes_per_s or None, rules.peer_pull_overhead_s)


def price_pull(chosen: ReplicaLoad, holder: ReplicaLoad, extra_blocks: int, block_size: int,
               fleet: FleetRates, rules: KVPlacementRules) -> tuple[float, float] | None:
    """(pull_s, recompute_s) of moving ``extra_blocks`` from ``holder`` to ``chosen`` (router/routing/cost/pull.py);
    None when no pull is possible (transfer off on either end, peer pulls off) or it cannot be priced."""
    priors = pull_priors(rules)
    if extra_blocks <= 0 or not can_pull(chosen, holder, priors):
        return None
    spt = prefill_s_per_token(chosen, fleet)
    pull_s = pull_seconds(chosen, fleet, extra_blocks, block_size, priors)
    if spt is None or pull_s is None:
        return None
    return pull_s, extra_blocks * block_size * spt


def pull_source(chosen: Replica, chosen_blocks: int, device_matches: Mapping[ReplicaId, int],
                candidates: Collection[ReplicaId], usable_blocks: int) -> tuple[ReplicaId | None, int]:
    """(the replica among ``candidates`` (healthy, trusted, of any role) holding the most leading blocks beyond
    ``chosen_blocks``, the blocks it holds); (None, ``chosen_blocks``) when none holds more. By id: the index's
    matches name their holders so."""
    holder_id, held = None, chosen_blocks
    for rid, m in device_matches.items():
        m = min(m, usable_blocks)
        if m > held and rid != chosen.id and rid in candidates:
            holder_id, held = rid, m
    return holder_id, held


def plan_pull(chosen: Replica, chosen_blocks: int, holder: Replica, held: int, block_size: int,
              rules: KVPlacementRules, fleet: FleetRates) -> PlannedPull | None:
    """A pull for a request routed to ``chosen`` (holding ``chosen_blocks`` of it, device or host) from ``holder``
    (holding ``held``: ``pull_source``) when pulling is cheaper (``fleet``: ``FleetRates.of`` every load)."""
    if not can_pull(chosen.load, holder.load, pull_priors(rules)):
        return None
    priced = price_pull(chosen.load, holder.load, held - chosen_blocks, block_size, fleet, rules)
    if priced is None or not priced[0] < priced[1]:
        return None
    return PlannedPull(holder, (held - chosen_blocks) * block_size, *priced)
