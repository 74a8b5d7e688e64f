"""Fair share by tokens: the virtual token counter (AIBrix's VTC, llm-d's fairness).

Each tenant's usage is the tokens it made the fleet work for -- prompt tokens computed (not those found
cached) x1, output tokens x2, since a decode step costs more per token than a prefill chunk -- decayed
exponentially with a half-life, so a tenant idle for a while comes back as light as a new one. The
queue serves the tenant with the least usage first within a priority, so a tenant with 100 clients
gets no more than one with a single client when both want more than their share.
"""

from __future__ import annotations

import math

PROMPT_WEIGHT = 1.0
"""Weight of a computed prompt token in the counter (AIBrix's VTC: input x1)."""
OUTPUT_WEIGHT = 2.0
"""Weight of an output token (AIBrix's VTC: output x2)."""


def weighted_tokens(prompt_tokens: int, output_tokens: int) -> float:
    """What ``prompt_tokens`` computed and ``output_tokens`` generated add to a tenant's usage."""
    return PROMPT_WEIGHT * prompt_tokens + OUTPUT_WEIGHT * output_tokens


def decayed(value: float, since: float, now: float, half_life_s: float) -> float:
    """``value`` as of ``since``, decayed to ``now`` (half of it left per ``half_life_s``)."""
    if now <= since or value == 0.0:
        return value
    return value * math.exp(-math.log(2.0) * (now - since) / half_life_s)
