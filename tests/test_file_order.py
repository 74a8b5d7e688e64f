"""The longest test files go first (tests/file_order.py): whole files, in order inside, by their seconds."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .file_order import SECONDS, load_seconds, longest_first, seconds_from_junit

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Item:
    nodeid: str
    fixturenames: tuple[str, ...] = ()


def test_files_are_ordered_by_their_seconds_whole_and_in_their_own_order():
    items = [Item(n) for n in ("tests/a.py::x", "tests/b.py::x", "tests/a.py::y", "tests/c.py::x", "tests/b.py::y",
                               "tests/new.py::x")]
    seconds = {"tests/a.py": 1.0, "tests/b.py": 30.0, "tests/c.py": 5.0}  # new.py: the median, 5 s, after c.py
    assert [i.nodeid for i in longest_first(items, seconds)] == [
        "tests/b.py::x", "tests/b.py::y", "tests/c.py::x", "tests/new.py::x", "tests/a.py::x", "tests/a.py::y"]
    assert [i.nodeid for i in longest_first(items, {})] == [  # no seconds: files as collected, grouped
        "tests/a.py::x", "tests/a.py::y", "tests/b.py::x", "tests/b.py::y", "tests/c.py::x", "tests/new.py::x"]


def test_files_that_share_a_cluster_follow_the_longest_of_them():
    shared = ("kv_cluster",)
    items = [Item("tests/a.py::x"), Item("tests/s1.py::x", shared), Item("tests/b.py::x"),
             Item("tests/s2.py::x", ("tmp_path", *shared)), Item("tests/c.py::x")]
    seconds = {"tests/a.py": 50.0, "tests/s1.py": 40.0, "tests/b.py": 30.0, "tests/s2.py": 20.0, "tests/c.py": 10.0}
    assert [i.nodeid for i in longest_first(items, seconds)] == [
        "tests/a.py::x", "tests/s1.py::x", "tests/s2.py::x", "tests/b.py::x", "tests/c.py::x"]


def test_a_junit_report_gives_each_files_seconds(tmp_path):
    xml = tmp_path / "junit.xml"
    xml.write_text('<testsuites><testsuite name="pytest">'
                   '<testcase classname="tests.router.test_a" name="t1" time="1.25"/>'
                   '<testcase classname="tests.router.test_a.TestGroup" name="t2" time="2.5"/>'
                   '<testcase classname="tests.test_b" name="t[x]" time="10"/>'
                   '</testsuite></testsuites>')
    assert seconds_from_junit(str(xml)) == {"tests/test_b.py": 10.0, "tests/router/test_a.py": 3.8}


def test_the_recorded_seconds_name_test_files_that_exist():
    seconds = load_seconds()
    assert seconds, f"{SECONDS} is missing: refresh it as tests/file_order.py says"
    gone = [f for f in seconds if not (ROOT / f).is_file()]
    assert not gone, f"{SECONDS.name} names test files that are gone ({gone}): refresh it as tests/file_order.py says"
