"""The router's online correction of its predictions: observed over predicted time to first token, per replica.

The estimate (estimate.py) is built from what each replica measured of itself; what it leaves out (HTTP and
tokenization, the scheduler's order, requests other routers sent, a model that is not linear) shows as a ratio
between the TTFT a request then had and the one predicted for it. Each replica's ``ReplicaLoad.ttft_correction``
follows that ratio, an exponentially weighted mean in log space (ratios compose), and multiplies its next
predictions. It is bounded so one outlier (a request stuck behind a preemption) cannot make a replica look free
or unusable.
"""

from __future__ import annotations

import math

from kvmesh.router.routing.load import ReplicaLoad

WEIGHT = 0.1
"""Weight of the newest observation in the log-space mean (about the last 10 requests of the replica)."""
BOUNDS = (0.25, 4.0)
"""The correction stays within these factors of the raw estimate."""


def observe_ttft(load: ReplicaLoad, raw_predicted_s: float, actual_s: float) -> None:
    """A request routed to ``load``'s replica with a raw (uncorrected) prediction of ``raw_predicted_s`` had its
    first token after ``actual_s``: move the replica's correction towards ``actual / predicted``."""
    if not (raw_predicted_s > 0 and actual_s > 0):
        return
    lo, hi = BOUNDS
    ratio = min(max(actual_s / raw_predicted_s, lo), hi)
    log = (1 - WEIGHT) * math.log(load.ttft_correction) + WEIGHT * math.log(ratio)
    load.ttft_correction = min(max(math.exp(log), lo), hi)
