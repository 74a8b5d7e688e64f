"""``EmulatedStepClock``: when each emulated step ends, and how well the waits kept to it.

A step's planned end is its start plus the profile's seconds for its batch, times the dilation. Its start is
the moment the previous step's wait returned when the two steps share a request (the engine was busy between
them: the host's scheduling hides behind the device's step, as with vLLM's async scheduling), else the moment it
was launched (the engine was idle). The wait is a sleep of this thread only, so many replicas share a process.

What is reported (``EmulationLoad`` in ``/load``): the lateness of each step's end (actual minus planned: the
sleep's overshoot, or host work longer than the step), p50 and p99 over the last steps, and the engine thread's
CPU seconds per step (scheduling, outputs, events: everything but the wait).
"""

from __future__ import annotations

import time
from collections import deque

from kvmesh.replica.serving.load_report import EmulationLoad

WINDOW_STEPS = 4096
"""Steps whose lateness the percentiles are taken over."""


class EmulatedStepClock:
    """Plans and waits out emulated steps on one engine thread."""

    def __init__(self, profile: str, time_dilation: float) -> None:
        self.profile = profile
        self.time_dilation = time_dilation
        self.num_steps = 0
        self.busy_s = 0.0  # planned seconds of all steps
        self.cpu_s = 0.0  # the engine thread's CPU over all steps, waits excluded
        self.late: deque[float] = deque(maxlen=WINDOW_STEPS)
        self._last_end: float | None = None  # when the previous step's wait returned
        self._last_cpu: float | None = None  # thread CPU then

    def run_step(self, seconds: float, continues: bool) -> float:
        """Wait until the step of ``seconds`` (profile time, before dilation) ends; ``continues``: it shares a
        request with the previous step. Returns its lateness in seconds."""
        now, cpu = time.monotonic(), time.thread_time()
        if self._last_cpu is not None:
            self.cpu_s += cpu - self._last_cpu
        start = self._last_end if continues and self._last_end is not None else now
        planned = start + seconds * self.time_dilation
        if planned > now:
            time.sleep(planned - now)
        end = time.monotonic()
        self._last_end, self._last_cpu = end, time.thread_time()
        self.num_steps += 1
        self.busy_s += seconds * self.time_dilation
        self.late.append(end - planned)
        return end - planned

    def report(self) -> EmulationLoad:
        """What ``/load`` says of the emulation (read from any thread: a racy snapshot)."""
        late = sorted(self.late)
        n = self.num_steps
        return EmulationLoad(profile=self.profile, time_dilation=self.time_dilation, num_steps=n,
                             busy_s=self.busy_s, cpu_s_per_step=self.cpu_s / max(1, n - 1) if n > 1 else None,
                             late_s_p50=_quantile(late, 0.5), late_s_p99=_quantile(late, 0.99))


def _quantile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile of sorted ``values`` (nearest rank); None when empty."""
    if not values:
        return None
    return values[min(len(values) - 1, int(q * len(values)))]
