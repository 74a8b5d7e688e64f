"""`kvmesh serve --kv-cache-dtype fp8` as a user runs it: one stories260K replica with an FP8 KV cache gets ready
and answers the printed curl line through the router; its log says the cache is FP8 and where its scales came from."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import threading
import time

import pytest

from .test_serve_cli import KVMESH, READY_TIMEOUT_S, _descendants, _read_lines

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_serve_with_an_fp8_kv_cache_answers_through_the_router(stories_path, tmp_path):
    argv = [str(KVMESH), "serve", "--model", str(stories_path), "--num-replicas", "1", "--kv-cache-dtype", "fp8",
            "--kv-cache-memory", "8MiB", "--port", "0", "--http-port", "0", "--event-port", "0", "--verbose"]
    env = {**os.environ, "KVMESH_CACHE_DIR": str(tmp_path / "cache"), "PYTHONUNBUFFERED": "1",
           "KVMESH_CLUSTERS_DIR": str(tmp_path / "clusters")}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            cwd=tmp_path, start_new_session=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_read_lines, args=(proc.stdout, lines), daemon=True).start()
    seen: list[str] = []
    try:
        curl, deadline = None, time.monotonic() + READY_TIMEOUT_S
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
        answer = subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=60)
        assert answer.returncode == 0 and '"text_completion"' in answer.stdout, answer
        assert '"completion_tokens":16' in answer.stdout.replace(" ", "")
        log = "".join(seen)
        assert "KV cache in float8_e4m3fn" in log and "the others use 1.0" in log, log[-3000:]
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            for pid in _descendants(proc.pid):
                os.kill(pid, signal.SIGKILL)
            proc.kill()
            proc.wait()
