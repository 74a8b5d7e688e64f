"""KV that moves between simulated replicas: the prefill/decode split and peer prefix pulls.

Both halves of the P/D and peer-pull contract (issue 32; the router decides as router/routing/transfers.py
does), in simulated time:

- **split**: the router picks the decode replica first (cache-aware; prefill replicas are no candidates).
  When the prompt's uncached suffix there is at least the router's ``pd_min_uncached_tokens`` and the least
  loaded prefill replica has room (its backlog under ``pd_max_prefill_backlog_tokens``), a one-token
  *prefill leg* runs on that replica (its blocks stay in its
  cache, with their events). When the leg finishes, the decode replica pulls the prompt's KV it lacks and
  then serves the request: the first token comes from the decode replica, after the transfer.
- **peer pull**: when a replica (any role) holds more of the prompt than the one the policy picked and moving
  its extra blocks costs fewer seconds than computing them (``pull_is_cheaper``, the router's rule), the chosen
  replica pulls, from what the holder holds when the request reaches it, the leading blocks its own pool
  lacks. Moved tokens count as cached (``SimRequest.num_transferred_tokens`` keeps them apart).

A moved request joins its replica's queue when the transfer ends (``transfer_s``: bytes over the measured
bandwidth plus a fixed latency per transfer; a pull that finds nothing to move still pays the latency of
asking). A transfer takes no step time on either replica (the NIC's DMA moves it). The holder's blocks are
read when the transfer starts (a lease keeps them in the real system). A split's decode replica computes the
last prompt token again (vLLM's NixlConnector does): a real engine's 16-token blocks leave fewer than 16
tokens past the last full block, so the simulator's 512-token blocks, which would leave up to 511, are not
used for that remainder.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

from kvmesh.cluster.measure.sim.config import SimConfig
from kvmesh.cluster.measure.sim.replica import SimReplica, SimRequest
from kvmesh.router.routing.load import ReplicaLoad

ROUTER_TRANSFER_DEFAULTS: dict[str, float] = {
    "pd_min_uncached_tokens": 256, "pd_max_prefill_backlog_tokens": 16384, "peer_pulls": True,
    "peer_pull_overhead_s": 0.01}
"""The router's transfer settings (``RouterConfig``'s ``pd_*`` and ``peer_pull*`` fields) as the contract gives
them, used while the router section lacks a field."""
_TOKEN_RULES = ("pd_min_uncached_tokens", "pd_max_prefill_backlog_tokens")
DEFAULT_PD_MIN_UNCACHED_TOKENS = int(ROUTER_TRANSFER_DEFAULTS["pd_min_uncached_tokens"])


def router_rule(config: SimConfig, name: str) -> float:
    """The router's transfer setting ``name``, token counts in the simulation's tokens (divided by the
    miniature factor). The one place the simulator reads them: the router section's field where it has it,
    ``ROUTER_TRANSFER_DEFAULTS`` otherwise."""
    value = getattr(config.router, name, ROUTER_TRANSFER_DEFAULTS[name])
    return max(1, int(value) // config.miniature_factor) if name in _TOKEN_RULES else value


def pd_min_uncached_tokens(config: SimConfig) -> int:
    """The router's split threshold in the simulation's tokens."""
    return int(router_rule(config, "pd_min_uncached_tokens"))


def transfer_s(config: SimConfig, num_tokens: int) -> float:
    """Seconds to move the KV of ``num_tokens`` tokens between two replicas (the per-transfer latency alone
    for 0 tokens: the lease was asked for and released)."""
    return config.kv_transfer_latency_s + num_tokens * config.kv_bytes_per_token / config.kv_transfer_bytes_per_s


def pull_is_cheaper(config: SimConfig, num_tokens: int) -> bool:
    """The router's pricing rule: pull when ``blocks * bytes_per_block / pull_bytes_per_s + peer_pull_overhead_s``
    is fewer seconds than ``tokens / prefill_tokens_per_s`` on the chosen replica (every simulated replica
    reports the configured bandwidth and the cost model's prefill rate; the overhead is the router's estimate,
    the move itself then takes ``transfer_s``)."""
    pull_s = router_rule(config, "peer_pull_overhead_s") + num_tokens * config.kv_bytes_per_token / config.kv_transfer_bytes_per_s
    return num_tokens > 0 and pull_s < num_tokens * config.cost.prefill_s_per_token


def find_holder(matches: dict[Hashable, int], chosen: Hashable, own_blocks: int,
                usable_blocks: int) -> tuple[Hashable | None, int]:
    """The replica (any role) holding more leading blocks of the prompt than ``chosen`` holds (``own_blocks``, as
    matched before the router predicted the prompt there), the most (first found on a tie), and the extra blocks
    it holds; (None, 0) when none does. Matches are capped at ``usable_blocks``."""
    own = held = min(own_blocks, usable_blocks)
    holder = None
    for rid, m in matches.items():
        m = min(m, usable_blocks)
        if m > held and rid != chosen:
            holder, held = rid, m
    return holder, held - own


def pick_prefill_replica(loads: dict[Hashable, ReplicaLoad], prefill_ids: Iterable[Hashable],
                         max_backlog_tokens: int, chosen: Hashable | None = None) -> Hashable | None:
    """The least loaded prefill replica with room, as the router picks it: the smallest prefill backlog (then
    fewest in flight, then id) among those whose backlog is under ``max_backlog_tokens`` (the router's
    ``pd_max_prefill_backlog_tokens``); with ``chosen`` (``pd_prefill_pick=policy``), that one if it has room."""
    room = [(loads[r].prefill_backlog, loads[r].total_in_flight, r) for r in prefill_ids
            if r in loads and loads[r].prefill_backlog < max_backlog_tokens]
    if chosen is not None:
        return chosen if any(r == chosen for *_, r in room) else None
    return min(room)[2] if room else None


def held_prefix_tokens(replica: SimReplica, req: SimRequest) -> int:
    """Leading prompt tokens of ``req`` whose blocks ``replica`` holds now (device pool), capped as a hit is (the
    last prompt token is always computed). A look only: no stats, no touch."""
    from kvmesh.kvcache.hashing import RequestBlockHasher

    kv, bs = replica.kv, replica.config.engine.block_size
    hasher = RequestBlockHasher(bs, kv.none_hash, req.cache_salt, req.lora_name)
    cached = kv.block_pool.cached_block_hash_to_block
    n = 0
    for h in hasher.extend(req.all_token_ids[: (req.num_prompt_tokens - 1) // bs * bs]):
        if h not in cached:
            break
        n += 1
    return n * bs


def prefill_leg(req: SimRequest, prefill_id: int) -> SimRequest:
    """The request prefill replica ``prefill_id`` runs for a split ``req``: its prompt, one output token
    (linked both ways: ``req.prefill_leg``, ``leg.parent``)."""
    leg = SimRequest(f"{req.request_id}/prefill", req.arrival_s, req.hash_ids, req.num_prompt_tokens, 1,
                     all_token_ids=req.all_token_ids, cache_salt=req.cache_salt, lora_name=req.lora_name,
                     parent=req, router_index=req.router_index, replica_id=prefill_id)
    req.prefill_leg, req.prefill_replica_id = leg, prefill_id
    return leg


def plan_move(req: SimRequest, target: SimReplica, extent_tokens: int) -> float:
    """``target`` takes the first ``extent_tokens`` of ``req``'s prompt from another replica, moving only what its
    own pool lacks; records the move on ``req`` and returns its seconds."""
    own = min(held_prefix_tokens(target, req), extent_tokens)
    req.num_transferred_tokens = extent_tokens - own
    req.pull_extent_tokens = extent_tokens if req.num_transferred_tokens else 0
    req.transfer_s = transfer_s(target.config, req.num_transferred_tokens)
    return req.transfer_s


def plan_peer_pull(req: SimRequest, holder: SimReplica, target: SimReplica) -> float:
    """A peer pull at the request's arrival on ``target``: the holder's leased prefix (what it holds now)."""
    return plan_move(req, target, held_prefix_tokens(holder, req))


def plan_split_handoff(req: SimRequest, decode: SimReplica) -> float:
    """The decode side of a split whose prefill leg just finished: the whole prompt but its last token."""
    return plan_move(req, decode, req.num_prompt_tokens - 1)
