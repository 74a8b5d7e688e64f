"""The commands of the user guides (README.md, docs/*.md, deploy/README.md): found, classified, checked.

Every fenced block a reader may paste into a shell or Python (language ``bash``, ``sh``, ``shell``,
``console``, ``python`` or none) carries a marker, an HTML comment on the line right before its fence (not
shown when the Markdown is rendered)::

    <!-- docs-test: KIND -->              run and live
    <!-- docs-test: KIND (reason) -->     the others: which servers it needs, or why the test cannot run it

``KINDS`` says what each kind gets: every command of a guide runs (``run``, ``live``, ``server``) unless
it needs a GPU, a cluster of machines, a tool kvmesh does not install or the network (``gpu``, ``cluster``,
``external``), or installs something (``install``). A block without a marker fails the test, naming its file and line. A
block
of text that is not commands (a diagram, a printout) takes the language ``text``.
"""

from __future__ import annotations

import ast
import importlib
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GUIDES = ("README.md", "docs/*.md", "deploy/README.md")

KINDS = {
    "run": "runs in a subprocess in the quick tier (each command well under a minute)",
    "live": "runs against the test's own `kvmesh serve` (the embedded model on 127.0.0.1)",
    "server": "starts servers that run until stopped, or needs some running: runs with its servers started by the "
              "test in the background (tests/test_docs_commands_server.py)",
    "install": "installs something (pip, make): extras and make targets checked",
    "gpu": "needs a CUDA GPU: arguments parsed",
    "cluster": "needs a Ray cluster of cloud or on-prem machines: arguments and repository paths checked",
    "external": "needs a tool kvmesh does not install: syntax checked",
}
RUN_KINDS = ("run", "live")
"""Kinds whose commands run without servers of their own; every other kind needs a reason in its marker (a
``server`` block's says which servers it runs or needs)."""

SHELL_LANGUAGES = {"bash", "sh", "shell", "console", ""}
CHECKED_LANGUAGES = SHELL_LANGUAGES | {"python"}
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(\w+)\s*(?:\((.*)\))?\s*-->\s*$")
PROMPT = "$ "
"""A ``console`` block's commands start with it; its other lines are output."""


@dataclass
class Block:
    path: str  # relative to the repository
    line: int  # of the opening fence, 1-based
    language: str
    text: str
    kind: str | None
    reason: str = ""
    error: str = ""

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    def commands(self) -> list[str]:
        """The shell commands of a shell block (continuation lines joined, comments dropped)."""
        return shell_commands(self.text, console=self.language == "console")


def guide_paths() -> list[Path]:
    return sorted({p for pattern in GUIDES for p in REPO.glob(pattern)})


def blocks(paths: list[Path] | None = None) -> list[Block]:
    """Every checked block of the guides (language in ``CHECKED_LANGUAGES``), with its marker."""
    found = []
    for path in paths or guide_paths():
        lines = path.read_text().split("\n")
        i = 0
        while i < len(lines):
            opening = FENCE.match(lines[i])
            if not opening:
                i += 1
                continue
            fence, language = opening.group(2), opening.group(3).lower()
            end = next((j for j in range(i + 1, len(lines)) if lines[j].strip().startswith(fence)), len(lines))
            if language in CHECKED_LANGUAGES:
                found.append(_block(path, lines, i, end, language))
            i = end + 1
    return found


def _block(path: Path, lines: list[str], start: int, end: int, language: str) -> Block:
    rel = str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)
    indent = len(FENCE.match(lines[start]).group(1))
    text = "\n".join(line[indent:] for line in lines[start + 1:end])
    marker = MARKER.match(lines[start - 1]) if start else None
    if marker is None:
        return Block(rel, start + 1, language, text, None,
                     error=f"{rel}:{start + 1}: a ```{language} block without a marker on the line before its fence "
                           "(<!-- docs-test: KIND -->, KIND one of " + ", ".join(KINDS)
                           + "; text that is not commands: ```text)")
    kind, reason = marker.group(1), (marker.group(2) or "").strip()
    block = Block(rel, start + 1, language, text, kind, reason)
    if kind not in KINDS:
        block.error = f"{rel}:{start + 1}: unknown docs-test kind {kind!r} (one of {', '.join(KINDS)})"
    elif kind not in RUN_KINDS and not reason:
        block.error = f"{rel}:{start + 1}: docs-test: {kind} needs a reason: <!-- docs-test: {kind} (why) -->"
    return block


def shell_commands(text: str, console: bool = False) -> list[str]:
    """Logical commands of shell text: backslash continuations and quotes open across lines joined, comment
    lines and blank lines dropped; in a console block, only the lines after ``$ `` (and their continuations)."""
    commands, pending, continued = [], "", False
    for line in text.split("\n"):
        if not pending:
            if console:
                if not line.startswith(PROMPT):
                    continue
                line = line[len(PROMPT):]
            if not line.strip() or line.lstrip().startswith("#"):
                continue
        pending = f"{pending}{line}" if continued or not pending else f"{pending}\n{line}"
        continued = pending.endswith("\\")
        if continued:  # the next line joins with a space
            pending = pending[:-1].rstrip() + " "
            continue
        try:
            shlex.split(pending, comments=True)
        except ValueError:  # a quote still open: the command goes on
            continue
        commands.append(pending.strip())
        pending = ""
    if pending:
        commands.append(pending.strip())
    return commands


def words(command: str) -> list[str]:
    """The command's words, without leading ``NAME=value`` assignments."""
    argv = shlex.split(command, comments=True)
    while argv and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", argv[0]):
        argv.pop(0)
    return argv


def kvmesh_argvs(command: str) -> list[list[str]]:
    """The ``kvmesh`` command lines in a command: itself, or the one a wrapper runs (``ray exec FILE "..."``)."""
    argv = words(command)
    if not argv:
        return []
    if argv[0] == "kvmesh":
        return [argv[1:]]
    found = []
    for arg in argv[1:]:
        if " " in arg:  # a quoted command line (ray exec, ssh, bash -c)
            for inner in re.split(r"\s*(?:&&|;|\|\|)\s*", arg):
                found.extend(kvmesh_argvs(inner))
    return found


def parse_kvmesh(argv: list[str]) -> str | None:
    """Parse a kvmesh command line with the real parsers (the CLI's, and the one of ``bench load`` and
    ``bench compare-policies``); None when it parses, else the parser's message."""
    import contextlib
    import io

    from kvmesh.cluster.cli import SIM_MODES, build_parser

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            if len(argv) >= 2 and argv[0] == "sim" and argv[1] in SIM_MODES:
                return None if "--help" in argv else f"kvmesh sim {argv[1]}: only its --help is parsed here"
            args = build_parser().parse_args(argv)
            if getattr(args, "command", None) == "bench" and args.target in ("load", "compare-policies"):
                module = {"load": "load", "compare-policies": "compare"}[args.target]
                importlib.import_module(f"kvmesh.cluster.measure.loadgen.{module}").build_parser().parse_args(
                    args.args)
    except SystemExit as e:
        if e.code in (0, None):  # --help
            return None
        return err.getvalue().strip() or f"exit {e.code}"
    return None


def python_imports_resolve(source: str) -> list[str]:
    """``from kvmesh... import NAME`` lines of a Python block whose module or name does not exist."""
    missing = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kvmesh"):
            try:
                module = importlib.import_module(node.module)
            except ImportError as e:
                missing.append(f"{node.module}: {e}")
                continue
            missing += [f"{node.module}.{a.name}" for a in node.names if not hasattr(module, a.name)]
    return missing


def make_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), re.M))


def extras() -> set[str]:
    text = (REPO / "pyproject.toml").read_text()
    section = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    return set(re.findall(r"^([\w-]+)\s*=", section, re.M))


def install_problem(command: str) -> str | None:
    """What is wrong with an install command of the guides: a make target or a kvmesh extra that does not
    exist (``pip install '.[engine]'``, the wheel's ``[engine]``)."""
    argv = words(command)
    if argv[:1] == ["make"]:
        unknown = [t for t in argv[1:] if "=" not in t and not t.startswith("-") and t not in make_targets()]
        return f"no make target {unknown}" if unknown else None
    if argv[:1] == ["pip"] or argv[:3] == ["python", "-m", "pip"]:
        known = extras()
        for arg in argv:
            local = re.match(r"^(?:\.|\$\(ls dist/kvmesh-.*\.whl\)|dist/kvmesh.*\.whl)\[([\w,-]+)\]$", arg)
            if local:
                unknown = set(local.group(1).split(",")) - known
                if unknown:
                    return f"kvmesh has no extra {sorted(unknown)} (extras: {sorted(known)})"
    return None


def repo_paths_missing(command: str) -> list[str]:
    """Files of this repository a command names (``deploy/aws.yaml``, ``~/kvmesh/deploy/...`` on a cluster
    node, where the cluster configs put the checkout) that do not exist."""
    missing = []
    for word in re.findall(r"(?:~/kvmesh/)?(?:deploy|docs|results|tests)/[\w./-]+", command):
        rel = word.removeprefix("~/kvmesh/")
        if not (REPO / rel).exists():
            missing.append(word)
    return missing


def scratch_layout(root: Path, shared: Path) -> Path:
    """A folder ``root/kvmesh`` laid out as the checkout (its entries linked, ``results/`` empty, so that a
    command's output leaves the real one alone) with ``root/shared`` linked to ``shared`` beside it."""
    checkout = root / "kvmesh"
    checkout.mkdir()
    for entry in REPO.iterdir():
        if entry.name not in ("results", ".git"):
            (checkout / entry.name).symlink_to(entry)
    (checkout / "results").mkdir()
    (root / "shared").symlink_to(shared.resolve())
    return checkout


def run_command(command: str, where: str, cwd: Path, env: dict, timeout_s: float, private_tmp: bool = False,
                cpu_limit_s: float | None = None) -> str:
    """Run a guide's shell command with bash in ``cwd``; its output, or an AssertionError that says what failed.
    ``private_tmp``: a path under /tmp is moved into ``cwd``'s parent, so what the command writes there stays the
    test's. ``cpu_limit_s``: the CPU seconds each process of the command may use (``RLIMIT_CPU``), a budget that a
    loaded machine does not shorten; ``timeout_s`` is then only the wall-clock backstop against a hang."""
    import resource
    import subprocess

    def limit_cpu() -> None:
        if cpu_limit_s is not None:
            resource.setrlimit(resource.RLIMIT_CPU, (int(cpu_limit_s), int(cpu_limit_s) + 5))

    if private_tmp:
        command = re.sub(r"(?<![\w/.])/tmp/", f"{cwd.parent}/tmp-", command)
    try:
        result = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True,
                                timeout=timeout_s, preexec_fn=limit_cpu)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{where}: `{command}` ran past {timeout_s}s") from None
    if cpu_limit_s is not None and result.returncode in (-9, -24, 128 + 9, 128 + 24):
        raise AssertionError(f"{where}: `{command}` used more than {cpu_limit_s}s of CPU in one process")
    assert result.returncode == 0, (f"{where}: `{command}` exited {result.returncode}\n"
                                    f"{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
    return result.stdout


def curl_checked(command: str) -> str:
    """curl as the guides write it, failing on an HTTP error (-f) and saying why (-sS)."""
    return re.sub(r"^curl\b", "curl -sS -f", command)


def command_environment(bin_dir: Path, **variables: str) -> dict:
    """This environment with the venv's ``kvmesh`` first on PATH, output unbuffered, and ``variables``."""
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONUNBUFFERED": "1",
            **variables}
