"""Where a run's CPU goes: each test's CPU seconds and each test process's collection, written when asked.

``KVMESH_TEST_CPU_DIR=DIR`` makes each test process (xdist's controller and workers, or the only one) write
``DIR/<process>.json``: its CPU seconds when collection ended (interpreter start, imports, collecting), its total, and
each test's (setup + call + teardown: this process's user + system time, threads included, plus that of the child
processes it waited for meanwhile). CPU, not wall time: a loaded machine stretches the one, not the other.
``python tests/cpu_seconds.py DIR`` sums the files and names the costliest tests; ``--write`` adds those over
``SLOW_CPU_S`` to ``slow_tests.json``, which tests/tiers.py marks ``slow`` (entries already there stay: once slow, a
test no longer runs in the quick tier that measured it).
"""

from __future__ import annotations

import json
import os
import resource
import sys
from pathlib import Path

import pytest

DIR_ENV = "KVMESH_TEST_CPU_DIR"
SLOW_CPU_S = 0.5
"""A quick-tier test over this many CPU seconds is slow (the tier's whole run is kept under 3 minutes of CPU)."""
SLOW_TESTS = Path(__file__).with_name("slow_tests.json")
"""Test id -> its CPU seconds when measured over ``SLOW_CPU_S`` in a run of the quick tier."""


def cpu_now() -> float:
    """This process's user + system seconds and those of the children it has waited for."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class Recorder:
    def __init__(self, out: Path, name: str) -> None:
        self.out, self.name = out, name
        self.collected_s: float | None = None
        self.tests: dict[str, float] = {}

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session):
        self.collected_s = cpu_now()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        start = cpu_now()
        yield
        self.tests[item.nodeid] = round(cpu_now() - start, 3)

    def pytest_sessionfinish(self, session):
        self.out.mkdir(parents=True, exist_ok=True)
        report = {"collected_s": self.collected_s, "total_s": cpu_now(), "tests": self.tests}
        (self.out / f"{self.name}.json").write_text(json.dumps(report, indent=0))


def register(config: pytest.Config) -> None:
    if out := os.environ.get(DIR_ENV):
        name = os.environ.get("PYTEST_XDIST_WORKER", "controller")
        config.pluginmanager.register(Recorder(Path(out), name), "kvmesh-cpu-seconds")


def summary(folder: Path, top: int = 40) -> dict[str, float]:
    tests: dict[str, float] = {}
    for path in sorted(folder.glob("*.json")):
        report = json.loads(path.read_text())
        print(f"{path.stem}: collection {report['collected_s'] or 0:.1f} s CPU, total {report['total_s']:.1f} s, "
              f"{len(report['tests'])} tests {sum(report['tests'].values()):.1f} s")
        tests.update(report["tests"])
    for nodeid, seconds in sorted(tests.items(), key=lambda kv: -kv[1])[:top]:
        print(f"{seconds:8.2f}  {nodeid}")
    return tests


def load_slow(path: Path = SLOW_TESTS) -> dict[str, float]:
    return json.loads(path.read_text()) if path.exists() else {}


def write_slow(tests: dict[str, float], path: Path = SLOW_TESTS) -> None:
    slow = load_slow(path) | {nodeid: seconds for nodeid, seconds in tests.items() if seconds > SLOW_CPU_S}
    path.write_text(json.dumps(dict(sorted(slow.items())), indent=0) + "\n")


if __name__ == "__main__":
    measured = summary(Path(sys.argv[1]))
    if "--write" in sys.argv[2:]:
        write_slow(measured)
