"""The order test files run in: the longest first, so that two test processes end together.

``make test`` hands whole files to its processes (pytest-xdist ``--dist loadfile``), each the next file in
collection order when it is free (``--no-loadscope-reorder``). A long file handed out last runs alone at the end;
handed out first, the short files fill the other process meanwhile. Each file's seconds are those of one run of
the whole suite (``file_seconds.json``, setup + call + teardown of its tests, any machine: only the order counts).
A file not in it (new since) counts as the median of those that are. Within a file nothing moves.

Refresh the seconds after adding or renaming slow test files::

    make test PYTEST_ARGS=--junitxml=/tmp/junit.xml
    python tests/file_order.py /tmp/junit.xml        # writes tests/file_seconds.json
"""

from __future__ import annotations

import json
import statistics
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

SECONDS = Path(__file__).with_name("file_seconds.json")
"""Test file (from the repository root) -> its seconds in one run of the suite."""


def load_seconds(path: Path = SECONDS) -> dict[str, float]:
    return json.loads(path.read_text()) if path.exists() else {}


SHARED_STARTS = ("kv_cluster", "noisy_fleet")
"""Fixtures whose clusters test files share when one runs right after another in a process
(tests/security/conftest.py): the files that use one follow the longest of them."""


def longest_first(items: list, seconds: dict[str, float]) -> list:
    """``items`` grouped by file, the files in descending seconds (ties and unknown files keep their order), those
    that use a fixture of ``SHARED_STARTS`` right after the first of them."""
    by_file: dict[str, list] = {}
    for item in items:
        by_file.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    default = statistics.median(seconds.values()) if seconds else 0.0
    files = sorted(by_file, key=lambda f: -seconds.get(f, default))  # sorted() is stable
    sharing = {f: next((name for name in SHARED_STARTS
                        if any(name in getattr(item, "fixturenames", ()) for item in by_file[f])), None) for f in files}
    ordered: list[str] = []
    for f in files:
        if f not in ordered:
            ordered += [f] if sharing[f] is None else [g for g in files if sharing[g] == sharing[f]]
    return [item for f in ordered for item in by_file[f]]


def seconds_from_junit(xml: str) -> dict[str, float]:
    """Each test file's seconds in a junit XML report (pytest ``--junitxml``), rounded to 0.1 s."""
    totals: dict[str, float] = defaultdict(float)
    for case in ET.parse(xml).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")
        while module and not module[-1].startswith("test_"):  # a class inside the module
            module.pop()
        if module:
            totals["/".join(module) + ".py"] += float(case.get("time", 0))
    return {f: round(s, 1) for f, s in sorted(totals.items(), key=lambda kv: -kv[1])}


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/file_order.py JUNIT_XML   (from make test PYTEST_ARGS=--junitxml=JUNIT_XML)")
    seconds = seconds_from_junit(sys.argv[1])
    SECONDS.write_text(json.dumps(seconds, indent=0) + "\n")
    print(f"{SECONDS}: {len(seconds)} files, {sum(seconds.values()) / 60:.1f} min in all")
