"""How long this engine's decode steps take, measured on its own steps (the router prices a request's queue and
decode pace with it; ``/load``'s ``decode_step``).

A decode step's time is fitted by decayed least squares over recent decode-only steps::

    step_s = step_s0 + s_per_seq * batch + s_per_context_token * context_tokens

(``batch``: sequences decoding, ``context_tokens``: their summed context: the KV the step reads). Each step adds
its sample to decayed sums of the normal equations; the fit is their 3x3 solve, redone only when read. The
timestamps are the engine's own (launch to tokens read): nothing here syncs a device. A fit that is not
determined yet (too few or too alike steps: one batch size only) falls back to the simpler fits, the context
term then the batch term dropped, and every coefficient is kept >= 0.

``LinearFit`` is the same decayed least squares over any features (the KV pull's fixed cost and per-byte time
use it with one feature).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

from kvmesh.replica.serving.load_report import DecodeStepLoad

_MIN_VARIANCE = 1e-9
"""A feature (or what is left of it after the others) varying less than this, relative to its square, is not
determined by the samples and left out of the fit."""


class LinearFit:
    """Decayed least squares ``y = c0 + sum(c_i * x_i)`` over recent samples; coefficients clamped >= 0."""

    def __init__(self, num_features: int, decay: float = 0.98) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {decay}")
        self.decay = decay
        self.n = num_features + 1
        self._xtx = [[0.0] * self.n for _ in range(self.n)]
        self._xty = [0.0] * self.n
        self.num_samples = 0
        """Samples recorded (not decayed)."""
        self._solved: list[float] | None = None

    def record(self, y: float, *features: float, weight: float = 1.0) -> None:
        """One sample (``weight``: it counts as that many identical samples, e.g. a stretch of equal steps)."""
        x = (1.0, *features)
        d, xtx, xty = self.decay ** weight, self._xtx, self._xty
        for i in range(self.n):
            row, xi = xtx[i], x[i]
            for j in range(self.n):
                row[j] = row[j] * d + weight * xi * x[j]
            xty[i] = xty[i] * d + weight * xi * y
        self.num_samples += 1
        self._solved = None

    def coefficients(self) -> list[float] | None:
        """[c0, c1, ...], each >= 0; None before a sample. Features that the samples do not determine (they never
        varied) are dropped from the fit (coefficient 0)."""
        if not self.num_samples:
            return None
        if self._solved is None:
            self._solved = self._solve()
        return self._solved

    def _solve(self) -> list[float]:
        xtx, w = self._xtx, self._xtx[0][0]
        # a feature that never varied is the intercept under another name: not determined, left out
        active = [0] + [i for i in range(1, self.n)
                        if xtx[i][i] * w - xtx[0][i] ** 2 > _MIN_VARIANCE * xtx[i][i] * w]
        while len(active) > 1:
            coef = _solve(xtx, self._xty, active)
            if coef is None:
                active.pop()  # collinear with the others: drop the last feature
                continue
            bad = [i for i in active[1:] if coef[i] < 0]
            if not bad:
                coef[0] = max(coef[0], 0.0)
                return coef
            active.remove(bad[-1])  # a negative slope: drop it and refit (the intercept stays)
        return [max(self._xty[0] / w, 0.0) if w > 0 else 0.0] + [0.0] * (self.n - 1)


def _solve(a: list[list[float]], b: list[float], active: list[int]) -> list[float] | None:
    """Gaussian elimination of the normal equations restricted to ``active``; None when (near) singular."""
    k = len(active)
    m = [[a[i][j] for j in active] + [b[i]] for i in active]
    diag = [m[i][i] for i in range(k)]
    for col in range(k):
        piv = max(range(col, k), key=lambda r: abs(m[r][col]))
        if abs(m[piv][col]) <= _MIN_VARIANCE * diag[col]:
            return None
        m[col], m[piv] = m[piv], m[col]
        for r in range(k):
            if r != col and m[r][col]:
                f = m[r][col] / m[col][col]
                m[r] = [x - f * y for x, y in zip(m[r], m[col], strict=True)]
    out = [0.0] * len(a)
    for idx, i in enumerate(active):
        out[i] = m[idx][k] / m[idx][idx]
    return out


class Computed(Protocol):
    """What the fit reads of a request (the engine's ``Request``)."""

    num_computed_tokens: int


class DecodeStepTime:
    """The decode step-time model of this engine (``step_s = step_s0 + s_per_seq * batch + s_per_context_token *
    context``) fitted over its recent decode-only steps."""

    def __init__(self, decay: float = 0.98) -> None:
        self.fit = LinearFit(2, decay)

    def record(self, batch: int, context_tokens: int, seconds: float, num_steps: int = 1) -> None:
        """``num_steps`` decode steps of ``batch`` sequences over ``context_tokens`` took ``seconds`` each."""
        if batch <= 0 or seconds <= 0:
            return
        self.fit.record(seconds, float(batch), float(context_tokens), weight=float(num_steps))

    def record_step(self, requests: Mapping[str, Computed], request_ids: list[str], seconds: float) -> None:
        """One decode-only step of ``request_ids`` (their context read from ``requests``) took ``seconds``."""
        context = 0
        for rid in request_ids:
            request = requests.get(rid)
            if request is not None:
                context += request.num_computed_tokens
        self.record(len(request_ids), context, seconds)

    def coefficients(self) -> tuple[float, float, float] | None:
        """(step_s0, s_per_seq, s_per_context_token); None before the first decode step."""
        coef = self.fit.coefficients()
        return None if coef is None else (coef[0], coef[1], coef[2])

    @property
    def num_steps(self) -> int:
        return self.fit.num_samples


def decode_step_load(step_time: DecodeStepTime, running: Iterable[Computed]) -> DecodeStepLoad:
    """``/load``'s ``decode_step``: the fit and the running requests' summed context."""
    coef = step_time.coefficients()
    context = sum(r.num_computed_tokens for r in running)
    if coef is None:
        return DecodeStepLoad(context_tokens=context)
    return DecodeStepLoad(step_s=coef[0], s_per_seq=coef[1], s_per_context_token=coef[2],
                          num_steps=step_time.num_steps, context_tokens=context)
