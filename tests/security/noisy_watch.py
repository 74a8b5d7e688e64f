"""What the noisy-neighbour suite watches while the noisy tenant attacks: the light tenant's plain requests, timed one
after another (``LightTenant``), and the fleet's readings (noisy_fleet.py), every ``READ_EVERY_S`` (``Watch``), each
in a thread of the test's process until stopped.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass

import httpx

from .noisy_fleet import KEYS, NoisyFleet, Reading

READ_EVERY_S = 0.5
PLAIN = {"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0.0}
"""The light tenant's request."""


@dataclass(frozen=True)
class Timing:
    t0: float
    t1: float
    status: int | str

    @property
    def seconds(self) -> float:
        return self.t1 - self.t0


def p90(timings: list[Timing]) -> float:
    return statistics.quantiles([t.seconds for t in timings], n=10)[-1]


class _Loop:
    """A thread that runs ``step`` until stopped."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.step()

    def step(self) -> None:
        raise NotImplementedError


class LightTenant(_Loop):
    """The light tenant's plain completions, one at a time, each timed (a failure is timed too, its status kept)."""

    def __init__(self, url: str) -> None:
        super().__init__()
        self.timings: list[Timing] = []
        self._client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEYS['light']}"}, timeout=60)

    def step(self) -> None:
        t0 = time.monotonic()
        try:
            status: int | str = self._client.post("/v1/completions", json=PLAIN).status_code
        except httpx.HTTPError as e:
            status = type(e).__name__
        self.timings.append(Timing(t0, time.monotonic(), status))

    def between(self, t0: float, t1: float) -> list[Timing]:
        return [t for t in self.timings if t0 <= t.t0 < t1]


class Watch(_Loop):
    """The fleet's readings, every ``READ_EVERY_S``."""

    def __init__(self, fleet: NoisyFleet) -> None:
        super().__init__()
        self.fleet = fleet
        self.readings: list[Reading] = []

    def step(self) -> None:
        try:
            self.readings.append(self.fleet.read())
        except (httpx.HTTPError, OSError, KeyError) as e:
            self.readings.append(Reading(time.monotonic(), {}, {}, [f"no reading: {type(e).__name__}: {e}"]))
        self._stop.wait(READ_EVERY_S)
