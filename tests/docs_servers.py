"""Running a guide's ``server`` block: its long-running commands (``kvmesh serve``, ``replica``, ``router``,
``kvmesh events tail``, a Python reader loop) in the background on free ports of 127.0.0.1, its other commands in
order once they are ready, and everything stopped afterwards as Ctrl-C stops it (then SIGKILL).

The guides name fixed ports (a router on 8000, replicas' HTTP on 8100 + i, their events on 5557 + 2i and replay on
5558 + 2i); a block's ports are moved, family by family, to runs of free ports with the same offsets, and a
``kvmesh serve``, ``replica`` or ``router`` command that takes the defaults gets them as flags.
"""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from .docs_commands import curl_checked, run_command, words

PORT_FAMILIES = {8000: 4, 8100: 16, 5557: 32}
"""A guide's first port of each kind (router, replica HTTP, replica events) and how many follow it."""
SERVING = ("serve", "replica", "router")
READY_TIMEOUT_S = 180
COMMAND_TIMEOUT_S = 120
STOP_TIMEOUT_S = 60
EVENT_TIMEOUT_S = 60
"""How long a reader may take to print an event while requests go through."""
READY_LINE = "kvmesh is ready"
EPHEMERAL_BELOW = (10000, 32000)
"""Where a block's ports are picked: below Linux's ephemeral ports (32768 on), so no client socket takes one
between the pick and the server's bind."""


def free_run(count: int, tries: int = 200) -> int:
    """The first of ``count`` consecutive ports of 127.0.0.1 that are free now (from a random base below the
    ephemeral range, where outgoing connections would take them meanwhile)."""
    for _ in range(tries):
        base = random.randrange(*EPHEMERAL_BELOW)
        sockets = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise AssertionError(f"no {count} consecutive free ports found in {tries} tries")


def family_bases(base: int) -> dict[int, int]:
    """Each port family's first free port, one after another from ``base``: the families never overlap (picked
    apart, a router's run could fall inside the replicas' event ports)."""
    bases, offset = {}, 0
    for first, count in PORT_FAMILIES.items():
        bases[first], offset = base + offset, offset + count
    return bases


@dataclass
class Ports:
    """A block's guide ports and the free ones they become (the same offset from each family's first)."""

    bases: dict[int, int] = field(default_factory=lambda: family_bases(free_run(sum(PORT_FAMILIES.values()))))

    def __getitem__(self, guide_port: int) -> int:
        for first, count in PORT_FAMILIES.items():
            if first <= guide_port < first + count:
                return self.bases[first] + guide_port - first
        return guide_port

    def rewrite(self, text: str) -> str:
        """``text`` with every guide port after a host (``127.0.0.1:8000``, ``tcp://127.0.0.1:5557``) or a port
        flag (``--port 8100``, ``--event-port=5557``) moved."""
        text = re.sub(r"(?<=\b127\.0\.0\.1:)(\d+)\b|(?<=\blocalhost:)(\d+)\b",
                      lambda m: str(self[int(m.group(0))]), text)
        return re.sub(r"(--[\w-]*port[= ])(\d+)\b", lambda m: m.group(1) + str(self[int(m.group(2))]), text)

    def with_defaults(self, command: str) -> str:
        """A serving kvmesh command with the ports it takes by default given as flags."""
        argv = words(command)
        verb = argv[1] if argv[:1] == ["kvmesh"] and len(argv) > 1 else None
        defaults = {"serve": {"--port": 8000, "--http-port": 8100, "--event-port": 5557},
                    "replica": {"--port": 8100, "--event-port": 5557, "--replay-port": 5558},
                    "router": {"--port": 8000}}.get(verb, {})
        added = [f"{flag} {self[port]}" for flag, port in defaults.items()
                 if not any(a == flag or a.startswith(flag + "=") for a in argv)]
        if not added:
            return command
        head, sep, comment = command.partition(" #")
        return f"{head.rstrip()} {' '.join(added)}{sep}{comment}"


def serving_verb(command: str) -> str | None:
    """``serve``, ``replica``, ``router`` or ``tail`` for a command that runs until stopped, else None."""
    argv = words(command)
    if argv[:1] != ["kvmesh"] or len(argv) < 2:
        return None
    if argv[1] in SERVING:
        return argv[1]
    return "tail" if argv[1:3] == ["events", "tail"] else None


def flag_value(command: str, flag: str) -> str | None:
    argv = words(command)
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


@dataclass
class Background:
    """A command running in its own session, its output in ``log``."""

    command: str
    log: Path
    proc: subprocess.Popen

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> bool:
        """SIGINT to its process group (Ctrl-C), then SIGKILL to the group after ``STOP_TIMEOUT_S`` or to what
        it left there; whether Ctrl-C stopped the command."""
        interrupted = True
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                interrupted = False
        try:  # what it left in its group (a Ray worker, a replica process)
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=STOP_TIMEOUT_S)
        return interrupted


def _ctrl_c_as_in_a_shell() -> None:
    """In the child before it runs the command: Ctrl-C and SIGTERM take their default action, as a user's shell gives
    them. A test process may hold them ignored (a handler some earlier test left), and a process started with
    SIGINT ignored keeps it ignored (bash cannot reset it, Python then installs no KeyboardInterrupt)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def start(command: str, cwd: Path, env: dict, log: Path) -> Background:
    with log.open("w") as out:
        proc = subprocess.Popen(["bash", "-c", command], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=_ctrl_c_as_in_a_shell)
    return Background(command, log, proc)


def wait_ready(server: Background, verb: str, where: str) -> None:
    """Until ``kvmesh serve`` logs that it is ready, or a replica's or router's port answers ``/health``."""
    port = flag_value(server.command, "--port")
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        assert server.running(), f"{where}: `{server.command}` exited:\n{server.output()[-3000:]}"
        if verb == "serve":
            if READY_LINE in server.output():
                return
        else:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
        assert time.monotonic() < deadline, (f"{where}: `{server.command}` not ready in {READY_TIMEOUT_S}s:\n"
                                             + server.output()[-3000:])
        time.sleep(0.5)


def run_one(command: str, where: str, cwd: Path, env: dict) -> str:
    return run_command(curl_checked(command) if words(command)[:1] == ["curl"] else command, where, cwd, env,
                       COMMAND_TIMEOUT_S)


def python_command(text: str, script: Path) -> str:
    script.write_text(text)
    return f"{sys.executable} {script}"


@dataclass
class Session:
    """Servers and readers started for one or more blocks, on one ``Ports``; ``close`` stops them all."""

    cwd: Path
    env: dict
    logs: Path
    ports: Ports = field(default_factory=Ports)
    started: list[Background] = field(default_factory=list)
    readers: list[Background] = field(default_factory=list)
    replace: dict[str, str] = field(default_factory=dict)
    """Text of the guides the test replaces (a placeholder path by a real one)."""

    def substitute(self, text: str) -> str:
        """A guide's text as it runs here: its ports moved, what ``replace`` names replaced."""
        for old, new in self.replace.items():
            text = text.replace(old, new)
        return self.ports.rewrite(text)

    def prepare(self, command: str) -> str:
        """A guide's command as it runs here: substituted, and given the ports it takes by default."""
        return self.ports.with_defaults(self.substitute(command))

    def launch(self, command: str, verb: str, where: str) -> Background:
        """Start a command that runs until stopped and wait until it serves (a reader: started). A second
        ``kvmesh serve`` of a block is another way to start the cluster: the first is stopped for it."""
        if verb == "serve":
            for earlier in [s for s in self.started if serving_verb(s.command) == "serve"]:
                self.started.remove(earlier)
                assert earlier.stop(), f"{where}: Ctrl-C did not stop `{earlier.command}` in {STOP_TIMEOUT_S}s"
        server = start(command, self.cwd, self.env, self.logs / f"{len(self.started) + len(self.readers)}.log")
        if verb == "tail":
            self.readers.append(server)
        else:
            self.started.append(server)
            wait_ready(server, verb, where)
        return server

    def run_block(self, block) -> None:
        """The block's commands in order: the long-running ones started, the others run to exit 0."""
        if block.language == "python":
            script = self.logs / f"{block.path.replace('/', '_')}_{block.line}.py"
            command = python_command(self.substitute(block.text), script)
            if "while True" in block.text:
                self.launch(command, "tail", block.where)
            else:
                run_one(command, block.where, self.cwd, self.env)
            return
        for command in block.commands():
            command = self.prepare(command)
            verb = serving_verb(command)
            if verb:
                self.launch(command, verb, block.where)
            else:
                run_one(command, block.where, self.cwd, self.env)

    def complete(self, body: dict) -> httpx.Response:
        return httpx.post(f"http://127.0.0.1:{self.ports[8000]}/v1/completions", json=body, timeout=60)

    def metrics(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.ports[8000]}/metrics", timeout=30).text

    def await_events(self, where: str) -> None:
        """Requests through the router (a new prompt each, bounded) until every reader printed a stored block
        after the first went through."""
        if not self.readers:
            return
        marks = {id(r): len(r.output()) for r in self.readers}  # what they printed before (a snapshot)
        deadline = time.monotonic() + EVENT_TIMEOUT_S
        for n in range(1000):
            answer = self.complete({"prompt": f"Request {n}: once upon a time there was a little dog who liked "
                                              "to run in the park with the other dogs", "max_tokens": 4})
            assert answer.status_code == 200, f"{where}: a request through the router: {answer.text[:500]}"
            time.sleep(0.5)
            waiting = [r for r in self.readers if "BlockStored" not in r.output()[marks[id(r)]:]]
            if not waiting:
                return
            for reader in waiting:
                assert reader.running(), f"{where}: `{reader.command}` exited:\n{reader.output()[-3000:]}"
            assert time.monotonic() < deadline, (f"{where}: no BlockStored event in {EVENT_TIMEOUT_S}s from "
                                                 + "; ".join(f"`{r.command}`: {r.output()[-1000:]!r}"
                                                             for r in waiting))

    def close(self) -> list[str]:
        """Stop every reader and server, the last started first; the commands Ctrl-C did not stop in
        ``STOP_TIMEOUT_S`` (killed)."""
        return [proc.command for proc in reversed(self.started + self.readers) if not proc.stop()]
