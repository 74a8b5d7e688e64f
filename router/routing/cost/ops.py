"""The two ways the price's terms (terms.py) are evaluated: on one replica's floats, or on every row's arrays at once.

The terms are arithmetic (the same expressions, in the same order, IEEE doubles either way) plus the few operations
here, which choose and bound: ``SCALAR`` with Python's ``if`` and ``max``, ``ARRAY`` with numpy's ``where`` and
``maximum`` (both branches computed, so a branch must be harmless where it is not taken: NaN, never an exception).
Each pair gives the same float for the same inputs, so both evaluations of the terms give the same prices.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np


class Ops(NamedTuple):
    """One way to evaluate the terms (a named tuple: its fields are read per term, cheaply)."""

    where: Callable
    """``where(cond, a, b)``: ``a`` where ``cond``, else ``b``."""
    maximum: Callable
    """The larger of two, NaN if either is."""
    known: Callable
    """Not NaN (NaN: not measured, not known)."""
    steps: Callable
    """``steps(tokens, step_tokens)``: steps of ``step_tokens`` to get through ``tokens``, the exact ceiling; 1 when
    a step takes none."""


def _where(cond, a, b):
    return a if cond else b


def _maximum(a, b):
    return a if a >= b or a != a else b


def _known(x) -> bool:
    return x == x


def _steps(tokens, step_tokens: float):
    return -(-tokens // step_tokens) if step_tokens > 0 else 1


def _array_known(x):
    return ~np.isnan(x)


def _array_steps(tokens, step_tokens: float):
    if step_tokens > 0 and float(step_tokens).is_integer():
        # -(-x // t) is the exact ceiling; x / t rounded cannot cross an integer for whole x, t < 2**53
        return np.ceil(tokens / step_tokens)
    if step_tokens > 0:
        return -np.floor_divide(-tokens, step_tokens)
    return np.ones_like(tokens, dtype=np.float64)


SCALAR = Ops(_where, _maximum, _known, _steps)
"""The terms on one replica: Python floats and bools."""
ARRAY = Ops(np.where, np.maximum, _array_known, _array_steps)
"""The terms on every row: float64 and bool numpy arrays (a value the same on every row may stay a Python one)."""
NAN = math.nan
