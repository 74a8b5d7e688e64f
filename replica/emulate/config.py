"""The engine's ``emulation`` section: which GPU timing profile stands in for the model, and how slowed down.

Its flags keep short names (``--emulate h100-8b``, ``--emulate-time-dilation 2``): the section's field carries
``metadata={"prefix": ""}`` in ``EngineConfig``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvmesh.replica.emulate.cost_model import H100_8B_KV_BYTES_PER_TOKEN, CostModel
from kvmesh.replica.emulate.step_table import StepTimeTable, load_profile_file

PROFILES: dict[str, tuple[CostModel, int]] = {"h100-8b": (CostModel(), H100_8B_KV_BYTES_PER_TOKEN)}
"""Named profiles: the step-time model and the KV bytes per token it sizes the cache with."""


@dataclass(frozen=True, slots=True)
class EmulationConfig:
    """An emulated replica: the real engine, its forward pass replaced by waiting out a timing profile."""

    emulate: str | None = None
    """Run no model: each step waits the time a GPU timing profile gives its batch, tokens come from a hash.
    "h100-8b" (the simulator's H100 8B cost model) or a profile file (docs/emulated-fleet.md); None: a real model."""
    emulate_time_dilation: float = 1.0
    """Every emulated step takes this many times its profile's seconds (2: a GPU half as fast)."""
    emulate_eos: bool = False
    """Emulated outputs may sample an end-of-sequence token (a request then ends early unless ignore_eos); off:
    they never do, so every request runs to max_tokens or a stop."""

    def __post_init__(self) -> None:
        if self.emulate is not None:
            if not isinstance(self.emulate, str) or not self.emulate:
                raise ValueError(f"emulate must be a profile name ({', '.join(PROFILES)}) or a file, "
                                 f"got {self.emulate!r}")
            if self.emulate not in PROFILES and not Path(self.emulate).is_file():
                raise ValueError(f"emulate={self.emulate!r} is neither a named profile ({', '.join(PROFILES)}) nor "
                                 "a profile file that exists")
        if not (isinstance(self.emulate_time_dilation, int | float) and self.emulate_time_dilation > 0):
            raise ValueError(f"emulate_time_dilation must be a number > 0, got {self.emulate_time_dilation!r}")

    @property
    def enabled(self) -> bool:
        return self.emulate is not None

    def profile(self) -> tuple[CostModel | StepTimeTable, int]:
        """The step-time model and the KV bytes per token it sizes the cache with (reads a profile file)."""
        assert self.emulate is not None, "profile() of a replica that emulates nothing"
        if self.emulate in PROFILES:
            return PROFILES[self.emulate]
        return load_profile_file(self.emulate)
