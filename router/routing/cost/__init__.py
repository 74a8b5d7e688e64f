"""The router's cost in seconds: one predicted time per candidate replica, from what each measures.

One concept per file: ``fleet.py`` (priors from the other replicas for a rate not measured yet), ``estimate.py``
(the TTFT and decode pace of one request on one replica), ``pull.py`` (a peer pull's seconds),
``candidates.py`` (every candidate priced, with its pull; ``prices.py`` the answer, ``columns_price.py`` the
same price for every replica at once, vectorised), ``correction.py`` (observed/predicted, learned online).
Used by ``cache_aware`` (policies/cache_aware.py), ``KVRouter`` (``RouteDecision.predicted_ttft_s``) and the split
and pull decisions (kv_placement.py). Pure, no I/O, no torch.
"""

from kvmesh.router.routing.cost.candidates import price_all, price_one
from kvmesh.router.routing.cost.correction import observe_ttft
from kvmesh.router.routing.cost.estimate import TTFTEstimate, estimate, prefill_s_per_token
from kvmesh.router.routing.cost.fleet import FleetRates
from kvmesh.router.routing.cost.prices import Prices
from kvmesh.router.routing.cost.pull import PullPriors, can_pull, pull_seconds

__all__ = ["FleetRates", "Prices", "PullPriors", "TTFTEstimate", "can_pull", "estimate", "observe_ttft",
           "prefill_s_per_token", "price_all", "price_one", "pull_seconds"]
