"""The router's cost in seconds: one predicted time per candidate replica, from what each measures.

The price is one list of terms (``terms.py``), written once over one replica's floats or every replica's arrays
(``ops.py``: the two evaluations), from a replica's record read once (``measured.py``) and the fleet's priors for a
rate it has not measured yet (``fleet.py``). ``estimate.py`` evaluates it on one replica (``TTFTEstimate``: the
TTFT and decode pace of one request there), ``columns_price.py`` on every replica at once (the load columns,
``load_columns.py``); ``candidates.py`` prices every candidate with its pull (``prices.py`` the answer),
``pull.py`` a peer pull's seconds, ``correction.py`` the observed/predicted fit, learned online.
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
