"""The tables of README.md, BENCHMARKS.md and the guides, generated from the results files of the commands printed
above them: every block between

    <!-- table: KIND results/FILE.json -->
    ...
    <!-- /table -->

is rewritten from that file by KIND's renderer (benchmarks/report/kinds.py lists the kinds and what each
shows). A FILE with ``*`` names every file it matches, in name order (for the kinds that take several).

    kvmesh bench report            # rewrite every table from its file
    kvmesh bench report --check    # exit 1 naming every table that differs from its file (tests/test_doc_tables.py)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from kvmesh.cluster.measure.benchmarks.report.kinds import MANY_RENDERERS, RENDERERS, ROOTED_RENDERERS

DOCS = ("README.md", "BENCHMARKS.md", "docs/gpu-cluster.md", "docs/benchmarks/routing-against-peers.md",
        "docs/multi-host-routers.md", "docs/benchmarks/engine-cpu.md", "docs/benchmarks/several-routers.md",
        "docs/benchmarks/live-verdict.md", "docs/emulated-fleet.md")
"""The documents whose tables are generated (a guide holds the ones BENCHMARKS.md points to)."""
BLOCK = re.compile(r"(<!-- table: (\w+) (\S+) -->\n)(.*?)(<!-- /table -->)", re.S)


def render(text: str, root: Path) -> tuple[str, list[str]]:
    """``text`` with every table block regenerated from its file under ``root``, and the blocks that changed."""
    changed: list[str] = []

    def one(m: re.Match) -> str:
        head, kind, rel, body, tail = m.groups()
        if kind in MANY_RENDERERS or kind in ROOTED_RENDERERS:
            paths = sorted(root.glob(rel))
            if not paths:
                raise FileNotFoundError(f"{rel}: no results file of a generated table matches (run its command)")
            docs = [json.loads(p.read_text()) for p in paths]
            rendered = MANY_RENDERERS[kind](docs) if kind in MANY_RENDERERS else ROOTED_RENDERERS[kind](docs, root)
            table = rendered + "\n"
        elif kind in RENDERERS:
            path = root / rel
            if not path.exists():
                raise FileNotFoundError(f"{rel}: the results file of a generated table is missing (run its command)")
            table = RENDERERS[kind](json.loads(path.read_text())) + "\n"
        else:
            known = ", ".join([*RENDERERS, *MANY_RENDERERS, *ROOTED_RENDERERS])
            raise ValueError(f"table kind {kind!r} unknown; known: {known}")
        if table != body:
            changed.append(f"{kind} {rel}")
        return head + table + tail

    return BLOCK.sub(one, text), changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 when a table differs from its file")
    ap.add_argument("--root", type=Path, default=Path.cwd(), help="the checkout (default: here)")
    args = ap.parse_args(argv)
    stale = []
    for name in DOCS:
        path = args.root / name
        text, changed = render(path.read_text(), args.root)
        stale += [f"{name}: {c}" for c in changed]
        if changed and not args.check:
            path.write_text(text)
    for line in stale:
        print(("differs: " if args.check else "rewrote: ") + line)
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
