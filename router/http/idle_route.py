"""Where a request the admission gate would hold for its busy replica goes while another replica is idle
(``admission.hold_while_idle`` off; router/http/admission_gate.py): the fleet has room, so it waits in no queue of the
router's. It goes where its predicted time to first token is sooner: into its busy replica's queue, or to the idle
replica its policy prefers among the idle ones. Held, it would wait until room is seen, hidden from the prefix index.
Sent to the idle replica, its route receipt keeps the best hit of the whole pool (``offered``): the prefix its busy
holder had was passed over for a sooner start, which the receipt and the live ceiling tell from one held nowhere."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvmesh.router.http.replica_room import is_idle
from kvmesh.router.routing.policies import NoReplicaError

if TYPE_CHECKING:
    from kvmesh.router.http.proxy_request import ProxyRequest
    from kvmesh.router.routing.kv_router import KVRouter, RouteDecision


def sooner_while_idle(router: KVRouter, request: ProxyRequest, held: RouteDecision) -> RouteDecision | None:
    """``held`` (its policy's choice, a busy replica) where its predicted TTFT is no later than on the idle replica
    the policy prefers, else that one's route (both priced, not committed); a policy that predicts none: the idle
    one. None: no replica that serves the request is idle."""
    busy = held.replica
    idle = frozenset(r.id for r in router.replicas.candidates() if r is not busy and is_idle(r))
    if not idle:
        return None
    try:
        spare = request.route(router, [], commit=False, within=idle)
    except NoReplicaError:  # none of them serves its model
        return None
    if held.predicted_ttft_s is not None and (spare.predicted_ttft_s is None
                                              or held.predicted_ttft_s <= spare.predicted_ttft_s):
        return held
    offered(spare, held)
    return spare


def offered(spare: RouteDecision, held: RouteDecision) -> None:
    """``spare``'s receipt names the best hit of the whole pool (``held``'s candidates), not of the idle replicas
    alone: a prefix its busy holder offered was passed over for a sooner start, never unknown."""
    ours, theirs = spare.receipt, held.receipt
    if ours is not None and theirs is not None and theirs.best_hit_tokens > ours.best_hit_tokens:
        ours.best_hit_tokens, ours.best_replica_id = theirs.best_hit_tokens, theirs.best_replica_id
