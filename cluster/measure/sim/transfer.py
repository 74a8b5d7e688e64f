"""KV that moves between simulated replicas: the prefill/decode split and peer prefix pulls.

Both halves of the P/D and peer-pull contract (the router decides as router/routing/kv_placement.py
does), in simulated time:

- **split**: the router picks the decode replica first (cache-aware; prefill replicas are no candidates).
  When the prompt's uncached suffix there is at least the router's ``pd_min_uncached_tokens``, a prefill
  replica has room (its backlog under ``pd_max_prefill_backlog_tokens``) and the split is worth its seconds
  (``pd_ttft_slack_s``, ``pd_stall_weight``), a one-token *prefill leg* runs on that replica (its blocks stay in its
  cache, with their events). When the leg
  finishes, the decode replica pulls the prompt's KV it lacks and then serves the request: the first token
  comes from the decode replica, after the transfer.
- **peer pull**: when a replica (any role) holds more of the prompt than the one the policy picked and moving
  its extra blocks costs fewer seconds than computing them (the router's ``plan_pull``: bytes over the pull
  rate plus its ``peer_pull_overhead_s``, against tokens over the prefill rate), the chosen replica pulls,
  from what the holder holds when the request reaches it, the leading blocks its own pool lacks. Moved
  tokens count as cached (``SimRequest.num_transferred_tokens`` keeps them apart).

A moved request joins its replica's queue when the transfer ends (``transfer_s``: bytes over the measured
bandwidth plus a fixed latency per transfer; a pull that finds nothing to move still pays the latency of
asking). A transfer takes no step time on either replica (the NIC's DMA moves it). The holder's blocks are
read when the transfer starts (a lease keeps them in the real system). A split's decode replica computes the
last prompt token again (vLLM's NixlConnector does): a real engine's 16-token blocks leave fewer than 16
tokens past the last full block, so the simulator's 512-token blocks, which would leave up to 511, are not
used for that remainder.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvmesh.cluster.measure.sim.config import SimConfig, cache_bytes_per_token
from kvmesh.cluster.measure.sim.replica import SimReplica, SimRequest
from kvmesh.kvcache.reuse import reusable_blocks
from kvmesh.router.replicas.load import ReplicaLoad


def transfer_s(config: SimConfig, num_tokens: int) -> float:
    """Seconds to move the KV of ``num_tokens`` tokens between two replicas (the per-transfer latency alone
    for 0 tokens: the lease was asked for and released)."""
    return config.kv_transfer_latency_s + num_tokens * cache_bytes_per_token(config) / config.kv_transfer_bytes_per_s


def pick_prefill_replica(loads: dict[str, ReplicaLoad], prefill_ids: Iterable[str],
                         max_backlog_tokens: int, chosen: str) -> str | None:
    """``pd_prefill_pick=policy``: the policy's ``chosen`` prefill replica if it has room as the router counts
    it (its backlog under ``pd_max_prefill_backlog_tokens``), else the least loaded one with room (the router's
    ``choose_prefill``: smallest backlog, then fewest in flight); None when none has room."""
    room = [(loads[r].prefill_backlog, loads[r].total_in_flight, r) for r in prefill_ids
            if r in loads and loads[r].prefill_backlog < max_backlog_tokens]
    if any(r == chosen for *_, r in room):
        return chosen
    return min(room)[2] if room else None


def held_prefix_tokens(replica: SimReplica, req: SimRequest) -> int:
    """Leading prompt tokens of ``req`` whose blocks ``replica`` holds now (device pool), capped as a hit is (the
    last prompt token is always computed). A look only: no stats, no touch."""
    from kvmesh.kvcache.hashing import RequestBlockHasher

    kv, bs = replica.kv, replica.config.engine.block_size
    hasher = RequestBlockHasher(bs, kv.none_hash, req.cache_salt, req.lora_name)
    cached = kv.block_pool.cached_block_hash_to_block
    n = 0
    for h in hasher.extend(req.all_token_ids[: reusable_blocks(req.num_prompt_tokens, bs) * bs]):
        if h not in cached:
            break
        n += 1
    return n * bs


def prefill_leg(req: SimRequest, prefill_id: str) -> SimRequest:
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
