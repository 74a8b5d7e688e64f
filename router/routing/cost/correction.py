"""The router's online correction of its predictions, per replica: observed against predicted time to first token.

The estimate (estimate.py) is built from what each replica measured of itself; what it leaves out (the HTTP hops
and the replica's own request handling, the scheduler's order, requests other routers sent, a model that is not
linear) shows as the difference between the TTFT a request then had and the one predicted for it. Each replica
keeps a decayed least-squares fit of ``observed = offset + scale * predicted`` over its recent requests
(``ReplicaLoad.ttft_sums``), and its next predictions go through it (the price's ``ttft_s``, terms.py): a fixed
overhead the estimate does not see lands in ``offset``, a rate that is off in ``scale``. Until the predictions it
saw varied enough to tell the two apart, the fit is the ratio of the sums (``offset`` 0). Both stay bounded, so
one outlier (a request stuck behind a preemption) cannot make a replica look free or unusable.
"""

from __future__ import annotations

from kvmesh.router.replicas.load import ReplicaLoad

DECAY = 0.9
"""Weight left to the older observations at each new one (about the last 10 requests of the replica count)."""
BOUNDS = (0.25, 4.0)
"""``scale`` stays within these factors of the raw estimate."""
MAX_OFFSET_S = 1.0
"""``offset`` stays within [0, this] seconds."""
_MIN_SPREAD = 0.05
"""The predictions' relative spread (std / mean) below which ``offset`` and ``scale`` cannot be told apart."""


def observe_ttft(load: ReplicaLoad, raw_predicted_s: float, actual_s: float) -> None:
    """A request routed to ``load``'s replica with a raw (uncorrected) prediction of ``raw_predicted_s`` had its
    first token after ``actual_s``: refit the replica's ``ttft_offset_s`` and ``ttft_correction`` (the scale)."""
    if not (raw_predicted_s > 0 and actual_s > 0):
        return
    x, y = raw_predicted_s, min(actual_s, BOUNDS[1] * raw_predicted_s + MAX_OFFSET_S)  # an outlier weighs bounded
    s = load.ttft_sums
    if not s:
        s.extend((0.0, 0.0, 0.0, 0.0, 0.0))
    for i, v in enumerate((1.0, x, y, x * x, x * y)):
        s[i] = s[i] * DECAY + v
    w, sx, sy, sxx, sxy = s
    var = sxx * w - sx * sx
    lo, hi = BOUNDS
    if var > (_MIN_SPREAD * sx) ** 2:
        scale = min(max((sxy * w - sx * sy) / var, lo), hi)
        offset = min(max((sy - scale * sx) / w, 0.0), MAX_OFFSET_S)
    else:
        scale, offset = min(max(sy / sx, lo), hi), 0.0
    load.ttft_correction, load.ttft_offset_s = scale, offset

