"""The processes ``kvmesh bench soak`` runs: a ``kvmesh router`` in front of two ``kvmesh replica`` processes of
stories260K on loopback, each its own process (so its memory is its own), with events and replay wired, tool calls
(a ChatML tools template, the ``hermes`` parser, ``tool_choice: auto`` served), two LoRA adapters written at start
(support/peft_writer.py) and a Responses store of the run's own; and each process tree's resident memory (/proc).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from kvmesh.cluster.measure.benchmarks.support.peft_writer import write_lora_adapter
from kvmesh.cluster.measure.loadgen.processes import free_port, stop_processes, wait_http

START_S = 300.0
"""How long a process may take to serve (two models loading at once on a busy machine)."""
ADAPTERS = ("soak-a", "soak-b")
"""The LoRA adapters every replica serves (rank 8, written from seeds 0 and 1)."""
SERVED = "stories"
"""The base model's served name."""
TOOLS_TEMPLATE = """{%- if tools %}{{- '<|im_start|>system\\n<tools>' }}{%- for tool in tools %}
{{- tool.function.name + ' ' }}{%- endfor %}{{- '</tools><|im_end|>\\n' }}{%- endif %}
{%- for message in messages %}
{%- if message.role == "assistant" and message.tool_calls %}{{- '<|im_start|>assistant' }}
{%- for tool_call in message.tool_calls %}{%- if tool_call.function is defined %}
{%- set tool_call = tool_call.function %}{%- endif %}
{{- '\\n<tool_call>\\n{"name": "' + tool_call.name + '", "arguments": ' }}
{{- (tool_call.arguments | tojson) + '}\\n</tool_call>' }}
{%- endfor %}{{- '<|im_end|>\\n' }}
{%- elif message.role == "tool" %}{{- '<|im_start|>user\\n<tool_response>\\n' + message.content }}
{{- '\\n</tool_response><|im_end|>\\n' }}
{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""
"""A ChatML template with tools (calls in ``<tool_call>`` tags: what ``hermes`` reads), its system turn cut to the
tools' names so that a chat fits stories260K's 512-token context (the model ships no template)."""
FRONTEND_FLAGS = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")


@dataclass
class SoakProcess:
    """A started kvmesh process: its name, URL and ``Popen``."""

    name: str
    popen: subprocess.Popen
    url: str = ""


@dataclass
class SoakFleet:
    """The router and the replicas (``stop`` ends all three)."""

    work: Path
    key: str = field(default_factory=lambda: "sk-soak-" + secrets.token_hex(8))
    processes: list[SoakProcess] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.processes[-1].url

    def start(self, model: Path) -> None:
        template = self.work / "tools.jinja"
        template.write_text(TOOLS_TEMPLATE)
        adapters = [f"{name}={write_lora_adapter(model, self.work / name, seed=i)}" for i, name in enumerate(ADAPTERS)]
        keys = self.work / "keys.json"
        keys.write_text(json.dumps({"keys": [{"key": self.key, "tenant": "soak"}]}))
        env = {k: v for k, v in os.environ.items() if not k.startswith("KVMESH_")}
        env |= {"KVMESH_HASH_SEED": secrets.token_hex(16), "KVMESH_INTERNAL_KEY": "int-" + secrets.token_hex(12)}
        common = ["--model", str(model), "--served-model-name", SERVED, "--host", "127.0.0.1",
                  "--chat-template", str(template), *FRONTEND_FLAGS]
        try:
            replicas = [self._replica(f"replica-{i}", common, adapters, env) for i in range(2)]  # both load at once
            specs = [self._serving(p) for p in replicas]
            port = free_port()
            with (self.work / "router.log").open("w") as log:
                popen = subprocess.Popen(
                    [sys.executable, "-m", "kvmesh.cluster.cli", "router", *common, "--port", str(port),
                     "--admission-keys-file", str(keys), "--log-level", "warning",
                     "--responses-path", str(self.work / "responses.sqlite3"),
                     *(a for spec in specs for a in ("--replica", spec))],
                    stdout=subprocess.DEVNULL, stderr=log, env=env)
            self.processes.append(SoakProcess("router", popen, f"http://127.0.0.1:{port}"))
            wait_http(self.url, timeout_s=START_S, proc=popen)
        except BaseException:
            self.stop()
            raise

    def _replica(self, name: str, common: list[str], adapters: list[str], env: dict) -> SoakProcess:
        with (self.work / f"{name}.log").open("w") as log:
            popen = subprocess.Popen(
                [sys.executable, "-m", "kvmesh.cluster.cli", "replica", *common, "--port", "0", "--event-port", "0",
                 "--replay-port", "0", "--kv-cache-memory", "8MiB", "--enable-lora", "--max-lora-rank", "8",
                 "--lora-modules", *adapters], stdout=subprocess.PIPE, stderr=log, env=env, text=True)
        self.processes.append(SoakProcess(name, popen))
        return self.processes[-1]

    def _serving(self, replica: SoakProcess) -> str:
        """Once ``replica`` serves: its ``--replica`` spec for the router (its URL set)."""
        assert replica.popen.stdout is not None
        deadline = time.monotonic() + START_S
        line = ""
        while not line.startswith("{"):
            line = replica.popen.stdout.readline()
            if not line or time.monotonic() > deadline:
                tail = (self.work / f"{replica.name}.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"kvmesh replica {replica.name} did not start ({replica.popen.poll()}):\n{tail}")
        threading.Thread(target=replica.popen.stdout.read, daemon=True).start()  # never blocking it
        end = json.loads(line)
        replica.url = end["http_url"]
        return f"{end['http_url']},events={end['events_endpoint']},replay={end['replay_endpoint']},name={replica.name}"

    def rss_mb(self) -> dict[str, float]:
        """Each process's resident memory with its descendants', MB (/proc)."""
        return {p.name: tree_rss_kb(p.popen.pid) / 1024 for p in self.processes}

    def exited(self) -> list[str]:
        return [f"{p.name} exited with {p.popen.returncode}" for p in self.processes if p.popen.poll() is not None]

    def stop(self) -> None:
        stop_processes([p.popen for p in self.processes], 20.0)


def tree_rss_kb(pid: int) -> int:
    """``VmRSS`` (kB) of ``pid`` and all its live descendants (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    children.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
            except OSError:
                continue
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        total += _vm_rss_kb(p)
        stack += children.get(p, [])
    return total


def _vm_rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:  # it ended meanwhile
        pass
    return 0
