"""The queue's tail as the router measures it: how long its recent requests waited behind others before their own
prefill, against their time-to-first-token targets, and the load weight that follows from it
(``CacheAwareTokensConfig.tail_knee``).

A request's wait is its observed TTFT less the part of its estimate that was its own work (its prefill, load-back,
pull and adapter load: ``TTFTEstimate``), so a long prompt that takes its target's time to compute on an idle replica
counts no wait. The tail is the ``quantile`` of ``wait / target`` over the last ``window`` requests routed by this
router. The load weight rises with it past the knee::

    lift = clamp((tail - knee) / (1 - knee), 0, 1)       0 while the tail is under knee x the target, 1 at the target
    w    = base + (top - base) * lift                     base: the policy's backlog_weight; top: its tail_weight

Past the target the lift stays 1, or with ``overload`` falls linearly to 0 at that many targets (a fleet whose waits
are far past its target lacks compute, which a hit saves).

While the queues stay short against the target, queued prefill weighs ``backlog_weight`` (reuse first: a hit saves
compute every later request gets back); as the measured waits near the target, a queued token weighs more, up to
``top``, and a holder whose queue would push a request past its target loses it to a replica that computes it
sooner. It is a feedback loop on the fleet's own measure: spreading shortens the waits, which lowers the weight
again. Where the fleet is overloaded the waits grow whatever the weight, and the lift only gives hits away while the
queues build up (the simulator's verdict: docs/benchmarks/routing-against-peers.md).
"""

from __future__ import annotations

import math
from collections import deque

from kvmesh.router.routing.cost.estimate import TTFTEstimate


def lifted(base: float, top: float, lift: float) -> float:
    """The load weight on queued prefill tokens: ``base`` (the policy's ``backlog_weight``) lifted towards ``top``
    (``tail_weight``) as far as ``lift`` says (the numpy walk calls it too)."""
    return base + (top - base) * lift if lift and top > base else base


class QueueTail:
    """The recent requests' waits over their TTFT targets, and the lift of the load weight they give."""

    def __init__(self, knee: float, quantile: float = 0.9, window: int = 256, overload: float = math.inf) -> None:
        if not 0 <= knee < 1:
            raise ValueError(f"tail_knee must be in [0, 1), got {knee}")
        if not 0 < quantile <= 1:
            raise ValueError(f"tail_quantile must be in (0, 1], got {quantile}")
        if window < 1:
            raise ValueError(f"tail_window must be >= 1, got {window}")
        if not overload > 1:
            raise ValueError(f"tail_overload must be > 1, got {overload}")
        self.knee, self.quantile, self.overload = knee, quantile, overload
        self.ratios: deque[float] = deque(maxlen=window)
        """``wait / target`` of the last ``window`` requests observed, oldest first."""
        self._every = max(1, window // 16)
        """Observations between two computations of the tail (it moves by at most this share of the window)."""
        self._since = 0
        self.tail = 0.0
        """The ``quantile`` of ``ratios`` when last computed (0: none observed)."""
        self.lift = 0.0
        """How far the load weight is lifted from its base towards its top (``weight``), in [0, 1]."""

    def observe(self, estimate: TTFTEstimate | None, actual_s: float, target_s: float) -> None:
        """A request the router priced as ``estimate`` had its first token ``actual_s`` after routing; its target
        was ``target_s``. Unpriced requests (no estimate, or unit rates) and bad values teach nothing."""
        if estimate is None or not estimate.priced or not target_s > 0 or not math.isfinite(actual_s):
            return
        wait = actual_s - estimate.own_s
        self.ratios.append(wait / target_s if wait > 0 else 0.0)
        self._since += 1
        if self._since >= self._every or len(self.ratios) < self._every:
            self._since = 0
            self._recompute()

    def _recompute(self) -> None:
        ordered = sorted(self.ratios)
        self.tail = ordered[min(len(ordered) - 1, int(self.quantile * len(ordered)))]
        tail = self.tail
        lift = (tail - self.knee) / (1 - self.knee) if tail <= 1 else 1 - (tail - 1) / (self.overload - 1)
        self.lift = 0.0 if lift < 0 else 1.0 if lift > 1 else lift

    def weight(self, base: float, top: float) -> float:
        """The load weight on queued prefill tokens, from the policy's ``base`` (its ``backlog_weight``) towards
        ``top`` (``tail_weight``) as far as the tail lifts it."""
        return lifted(base, top, self.lift)
