"""The two ways the price's terms (terms.py) are evaluated: on one replica's floats, or on every row's arrays at once.

The terms are arithmetic (the same expressions, in the same order, IEEE doubles either way) plus the few operations
here, which choose and bound: ``SCALAR`` with Python's ``if`` and ``max``, ``ARRAY`` with numpy's ``where`` and
``maximum`` (both branches computed, so a branch must be harmless where it is not taken: NaN, never an exception).
Each pair gives the same float for the same inputs, so both evaluations of the terms give the same prices.
"""

from __future__ import annotations

import math

import numpy as np


class ScalarOps:
    """The terms on one replica: Python floats and bools."""

    @staticmethod
    def where(cond, a, b):
        return a if cond else b

    @staticmethod
    def maximum(a, b):
        """numpy's ``maximum``: NaN if either is."""
        return a if a >= b or a != a else b

    @staticmethod
    def known(x) -> bool:
        """Not NaN (NaN: not measured, not known)."""
        return x == x

    @staticmethod
    def steps(tokens, step_tokens: float):
        """Steps of ``step_tokens`` to get through ``tokens``: the exact ceiling; 1 when a step takes none."""
        return -(-tokens // step_tokens) if step_tokens > 0 else 1


class ArrayOps:
    """The terms on every row: float64 and bool numpy arrays (a value the same on every row may be a float)."""

    where = staticmethod(np.where)
    maximum = staticmethod(np.maximum)

    @staticmethod
    def known(x):
        """Not NaN, per row."""
        return ~np.isnan(x)

    @staticmethod
    def steps(tokens, step_tokens: float):
        """``ScalarOps.steps`` per row."""
        if step_tokens > 0 and float(step_tokens).is_integer():
            # -(-x // t) is the exact ceiling; x / t rounded cannot cross an integer for whole x, t < 2**53
            return np.ceil(tokens / step_tokens)
        if step_tokens > 0:
            return -np.floor_divide(-tokens, step_tokens)
        return np.ones_like(tokens, dtype=np.float64)


SCALAR = ScalarOps()
ARRAY = ArrayOps()
NAN = math.nan
