"""The memory the grammar tests read of a replica's process tree (tests/grammar_processes.py) counts every process in
it, a child that psutil's ``children`` leaves out too (one whose start time reads earlier than its parent's)."""

from __future__ import annotations

import subprocess
import sys

import psutil

from ..grammar_processes import tree_rss, wait_for

PARENT = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); " \
         "time.sleep(60)"


def test_a_child_that_psutil_leaves_out_is_counted(monkeypatch):
    parent, children = subprocess.Popen([sys.executable, "-c", PARENT]), []
    try:
        proc = psutil.Process(parent.pid)
        assert wait_for(lambda: len(proc.children()) == 1, 30)
        child = proc.children()[0]
        children.append(child)
        monkeypatch.setattr(psutil.Process, "children", lambda self, recursive=False: [])
        both = proc.memory_info().rss + child.memory_info().rss
        assert abs(tree_rss(proc) - both) < 4 << 20  # the two read a moment apart
        assert tree_rss(proc) > proc.memory_info().rss + (4 << 20)
    finally:
        for p in children:
            p.kill()
        parent.kill()
        parent.wait(10)
