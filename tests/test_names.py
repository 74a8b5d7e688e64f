"""Names a reader can follow: no module named by a one- or two-letter alias, no two classes with one name.

An alias such as ``from kvmesh.replica.openai import protocol as p`` makes every use site (``p.CompletionRequest``)
say less than the name it hides; the code imports the names it uses (``from ...protocol import CompletionRequest``)
or, where a long list would not fit, the module by its own name. Only the aliases the whole Python world writes
(``STANDARD_ALIASES``) stay. Two classes with one name (the router's HTTP request and the engine's request were both
``Request``) make a reader guess which is meant; a class says which, except where one is the ``Protocol`` of the
other or the simulator's model of it (``SHARED_CLASS_NAMES``, each with its reason).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("kvcache", "events", "router", "replica", "cluster")
"""The package source (setup.py's ``TOP_LEVEL``)."""
SCANNED = (*PACKAGES, "tests")
"""Where short aliases are looked for: the package and its tests."""
SKIPPED = {".venv", "build", "__pycache__"}

STANDARD_ALIASES = {
    ("numpy", "np"), ("torch.nn.functional", "F"), ("triton.language", "tl"), ("multiprocessing", "mp"),
    ("hypothesis.strategies", "st"), ("xml.etree.ElementTree", "ET"),
}
"""(imported name, alias) pairs every reader knows."""

SHARED_CLASS_NAMES = {
    "AsyncModelRunnerOutput": ("replica/step/outputs.py declares the Protocol (vLLM's name) that "
                               "replica/worker/async_output.py's class implements"),
    "Fleet": ("router/control/runtime.py's Protocol is what the router reads of cluster/fleet/operations.py's Fleet "
              "(the router may not import cluster/)"),
    "Request": ("replica/spec_decode/drafting.py's Protocol is what drafting reads of the engine's Request "
                "(replica/engine/request.py)"),
    "LoRASlots": "cluster/measure/sim/lora.py is the simulator's model of a replica's slots (replica/lora/slots.py)",
}
"""Class name -> why two classes of the package share it."""


def _python_files(tops: tuple[str, ...], root: Path = ROOT):
    for top in tops:
        for path in sorted((root / top).rglob("*.py")):
            if not SKIPPED & set(path.relative_to(root).parts):
                yield path


def short_aliases(root: Path = ROOT) -> list[str]:
    """``file:line name as alias`` for every import aliased to one or two letters, standard ones aside."""
    found = []
    for path in _python_files(SCANNED, root):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                pairs = [(alias.name, alias.asname) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = "." * node.level + (node.module or "")
                pairs = [(f"{base}.{alias.name}" if node.module else base + alias.name, alias.asname)
                         for alias in node.names]
            else:
                continue
            found += [f"{path.relative_to(root)}:{node.lineno} {name} as {asname}" for name, asname in pairs
                      if asname is not None and len(asname) <= 2 and (name, asname) not in STANDARD_ALIASES]
    return found


def shared_class_names(root: Path = ROOT) -> dict[str, list[str]]:
    """Class name -> the files defining a class of that name, for names defined more than once in the package."""
    where: dict[str, list[str]] = defaultdict(list)
    for path in _python_files(PACKAGES, root):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ClassDef):
                where[node.name].append(str(path.relative_to(root)))
    return {name: files for name, files in where.items() if len(files) > 1}


def test_no_module_is_named_by_a_one_or_two_letter_alias():
    found = short_aliases()
    assert found == [], "import the names used (or the module by its name), not a short alias:\n" + "\n".join(found)


def test_no_two_classes_share_a_name_without_a_reason():
    shared = shared_class_names()
    unexplained = {name: files for name, files in shared.items() if name not in SHARED_CLASS_NAMES}
    assert unexplained == {}, f"classes that share a name (name one for what it is): {unexplained}"
    stale = sorted(set(SHARED_CLASS_NAMES) - set(shared))
    assert stale == [], f"SHARED_CLASS_NAMES lists names no longer shared: {stale}"


def test_the_checks_see_a_short_alias_and_a_shared_class_name(tmp_path):
    """The checks themselves can fail."""
    for top in ("router", "replica"):
        (tmp_path / top).mkdir()
    (tmp_path / "router" / "a.py").write_text("import numpy as np\nfrom kvmesh.replica.openai import protocol as p\n"
                                              "class Request:\n    pass\n")
    (tmp_path / "replica" / "b.py").write_text("from . import output as o\nclass Request:\n    pass\n")
    assert short_aliases(tmp_path) == ["router/a.py:2 kvmesh.replica.openai.protocol as p",
                                       "replica/b.py:1 .output as o"]
    assert shared_class_names(tmp_path) == {"Request": ["router/a.py", "replica/b.py"]}
