"""Tenants, priorities and latency targets layered on any workload (a fleet under overload).

A *tenant mix* names classes of traffic, each with its share of the requests, its priority (vLLM's
``priority``: lower is served first) and its targets: a time to first token and a mean inter-token time
(TPOT: the seconds between first and last token over the tokens after the first). A request that meets
both is *good* (goodput, ``sim/goodput.py``). Written as ``NAME:SHARE[:PRIORITY[:TTFT_S[:ITL_S]]]``
entries separated by commas, or a preset name::

    overload   flood:0.70:0:2:0.1, light-a:0.08:0:1:0.1, light-b:0.08:0:1:0.1, premium:0.14:-1:0.5:0.1

(``overload``: one tenant flooding with most of the requests, two light tenants, a high-priority class.)
Every record of one session (a conversation, an agent) belongs to one tenant; the draw is seeded.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from kvmesh.cluster.measure.workloads.generated import SessionRecord
from kvmesh.cluster.measure.workloads.traces import MooncakeRecord


@dataclass(frozen=True, slots=True)
class TenantClass:
    """One class of traffic: who sends it, how often, at which priority, with which targets."""

    name: str
    """The tenant's name (the router's tenant: an API key's tenant or the request's ``user``)."""
    share: float
    """Its share of the requests (shares are normalized over the mix)."""
    priority: int = 0
    """vLLM's request ``priority``: lower is served first."""
    ttft_s: float | None = None
    """Target time to first token in seconds (None: any)."""
    itl_s: float | None = None
    """Target mean inter-token time in seconds (None: any)."""

    def __post_init__(self) -> None:
        if not self.name or "," in self.name or ":" in self.name:
            raise ValueError(f"a tenant name must be non-empty without ',' or ':', got {self.name!r}")
        if not (self.share > 0 and math.isfinite(self.share)):
            raise ValueError(f"tenant {self.name}: share must be > 0, got {self.share}")
        for what, value in (("ttft_s", self.ttft_s), ("itl_s", self.itl_s)):
            if value is not None and not value > 0:
                raise ValueError(f"tenant {self.name}: {what} must be > 0 seconds, got {value}")


PRESETS: dict[str, str] = {
    "overload": "flood:0.70:0:2:0.1,light-a:0.08:0:1:0.1,light-b:0.08:0:1:0.1,premium:0.14:-1:0.5:0.1",
}
"""Named mixes (``--tenants overload``)."""


def parse_tenant_mix(text: str) -> list[TenantClass]:
    """A preset name or ``NAME:SHARE[:PRIORITY[:TTFT_S[:ITL_S]]],...`` -> the classes ("" -> none)."""
    text = PRESETS.get(text.strip(), text).strip()
    if not text:
        return []
    mix = []
    for entry in text.split(","):
        parts = [p.strip() for p in entry.split(":")]
        if not 2 <= len(parts) <= 5:
            raise ValueError(f"tenant entry {entry!r}: write NAME:SHARE[:PRIORITY[:TTFT_S[:ITL_S]]] "
                             f"(or a preset: {', '.join(PRESETS)})")
        try:
            share = float(parts[1])
            priority = int(parts[2]) if len(parts) > 2 and parts[2] else 0
            ttft = float(parts[3]) if len(parts) > 3 and parts[3] else None
            itl = float(parts[4]) if len(parts) > 4 and parts[4] else None
        except ValueError:
            raise ValueError(f"tenant entry {entry!r}: SHARE, TTFT_S and ITL_S are numbers, PRIORITY an "
                             "integer") from None
        mix.append(TenantClass(parts[0], share, priority, ttft, itl))
    names = [t.name for t in mix]
    if len(set(names)) != len(names):
        raise ValueError(f"tenant names repeat in {text!r}")
    return mix


def assign_tenants(records: Sequence[MooncakeRecord], mix: Sequence[TenantClass], seed: int = 0) -> list[TenantClass]:
    """Each record's class, drawn by share; the records of one session (``session_id``) share their draw."""
    if not mix:
        raise ValueError("an empty tenant mix assigns nothing")
    rng = random.Random(seed)
    weights = [t.share for t in mix]
    by_session: dict[str, TenantClass] = {}
    out = []
    for record in records:
        session = record.session_id if isinstance(record, SessionRecord) else None
        if session is None:
            out.append(rng.choices(mix, weights)[0])
            continue
        if session not in by_session:
            by_session[session] = rng.choices(mix, weights)[0]
        out.append(by_session[session])
    return out
