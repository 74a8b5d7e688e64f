"""`kvmesh serve` as a new user runs it: no flags, a subprocess; it gets ready, answers the printed
curl line, and Ctrl-C leaves no process behind."""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]

KVMESH = Path(sys.executable).parent / "kvmesh"
READY_TIMEOUT_S = 240
GENERATED_SECRET = re.compile(r"(?<![\w-])[\w-]{43}(?![\w-])")
"""A key serve generates (secrets.token_urlsafe(32): the admin and the internal key) standing alone in text."""


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _descendants(pid: int) -> set[int]:
    """All live descendants of ``pid`` (walks /proc; no psutil needed)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, stack = set(), [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            out.add(child)
            stack.append(child)
    return out


def _identity(pid: int) -> tuple[int, str] | None:
    """(pid, start time) of a live, non-zombie process; None otherwise (start time defeats pid reuse)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else (pid, fields[19])


def _command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _alive(identity: tuple[int, str]) -> bool:
    return _identity(identity[0]) == identity


def _read_lines(stream, sink: queue.Queue) -> None:
    for line in stream:
        sink.put(line)
    sink.put(None)


def test_serve_with_no_flags_gets_ready_and_answers_the_printed_curl_line(tmp_path):
    # Exactly what a new user types; only if something else holds a default port do we move it.
    argv = [str(KVMESH), "serve"] if _port_free(8000) else [str(KVMESH), "serve", "--port", "18000"]
    if not all(map(_port_free, (8100, 8101))):
        argv += ["--http-port", "0"]
    if not all(map(_port_free, range(5557, 5561))):
        argv += ["--event-port", "0"]
    seed = "cli-test-secret-seed-0123456789"  # must never be printed
    records = tmp_path / "clusters"  # where serve leaves its admin key for `kvmesh scale` (cluster/admin_key.py)
    env = {**os.environ, "KVMESH_CACHE_DIR": str(tmp_path / "cache"), "PYTHONUNBUFFERED": "1",
           "KVMESH_HASH_SEED": seed, "KVMESH_CLUSTERS_DIR": str(records)}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            cwd=tmp_path)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_read_lines, args=(proc.stdout, lines), daemon=True).start()
    seen: list[str] = []
    tree: set[tuple[int, str]] = set()
    try:
        curl = None
        deadline = time.monotonic() + READY_TIMEOUT_S
        while curl is None and time.monotonic() < deadline:
            try:
                line = lines.get(timeout=1)
            except queue.Empty:
                continue
            assert line is not None, "serve exited before ready:\n" + "".join(seen)
            seen.append(line)
            if line.strip().startswith("curl "):
                curl = line.strip()
        assert curl is not None, f"not ready within {READY_TIMEOUT_S}s:\n" + "".join(seen)
        assert any("kvmesh is ready" in s for s in seen)
        assert any("RANDOM weights" in s for s in seen)  # says clearly that its text is noise
        assert "127.0.0.1" in curl and "0.0.0.0" not in "".join(seen)

        answer = subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=60)
        assert answer.returncode == 0 and '"text_completion"' in answer.stdout, answer
        assert '"completion_tokens":16' in answer.stdout.replace(" ", "")

        (record,) = records.glob("*.json")
        assert record.stat().st_mode & 0o777 == 0o600 and record.stem in curl.replace(":", "_")

        tree = {i for i in map(_identity, _descendants(proc.pid)) if i is not None}
        assert tree, "serve started no processes?"
        command_lines = "\n".join(_command_line(pid) for pid, _ in tree)
        assert not GENERATED_SECRET.search(command_lines), "a generated key is on a command line (ps shows it)"
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            for pid in _descendants(proc.pid):
                os.kill(pid, signal.SIGKILL)
            raise
    assert code == 130  # stopped by Ctrl-C: 128 + SIGINT, as a shell reports it
    while (line := lines.get(timeout=10)) is not None:
        seen.append(line)
    assert "kvmesh: stopped" in "".join(seen)
    assert not list(records.glob("*.json")), "the stopped cluster's admin key record stayed"
    assert seed not in "".join(seen)
    assert not GENERATED_SECRET.search("".join(seen)), "serve printed a key it generated"
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(_alive(p) for p in tree):
        time.sleep(0.2)
    leftovers = [p for p in tree if _alive(p)]
    assert not leftovers, f"processes left after Ctrl-C: {leftovers}"
