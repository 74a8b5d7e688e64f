"""A variant of the default against the default itself, cell by cell (``kvmesh bench report``'s ``variant_gain``
tables): for each verdict metric, the paired difference variant - default over the arrival seeds both ran, with its
95% interval, as the verdict pairs the default with a rival (support/paired_verdict.py). The variant's runs are its
file's (``kvmesh bench policy_matrix --variant-of``); the default's are those of the file it names (``variant_of``),
whose seeds it ran again."""

from __future__ import annotations

import json
from pathlib import Path

from kvmesh.cluster.measure.benchmarks.support.matrix_seeds import variant_words
from kvmesh.cluster.measure.benchmarks.support.paired_verdict import FAIL, METRICS, Metric, Paired, beats, judge, paired


def _mark(metric: Metric, p: Paired) -> str:
    """The interval, in bold where it lies wholly beyond the verdict's margin on either side (as the verdict judges a
    rival better, or the default better than it)."""
    text = p.describe(metric)
    return f"**{text}**" if judge(metric, p) == FAIL or beats(metric, p) else text


def rows(variant: dict, default: dict) -> list[str]:
    """A row per cell of ``variant`` whose every seed ran (a cell mid-run is left out): its knobs, the cell, its seeds,
    then variant - default for each metric. A time's difference negative: the variant is faster; a share's positive:
    better."""
    name, knobs, out = variant["default"], variant_words(variant), []
    for key, cell in variant["cells"].items():
        if "refreshing" in cell or len(cell["seeds"]) < 2:
            continue
        theirs = default["cells"][key]["seeds"]
        seeds = sorted(cell["seeds"], key=int)
        if missing := [k for k in seeds if k not in theirs]:
            raise ValueError(f"{key}: seeds {', '.join(missing)} of the variant are not in {variant['variant_of']}")
        figures = [_mark(m, paired(m, [cell["seeds"][k][name][m.name] for k in seeds],
                                   [theirs[k][name][m.name] for k in seeds])) for m in METRICS]
        out.append(f"| {knobs} | {key} | {len(seeds)} | " + " | ".join(figures) + " |")
    return out


def table(docs: list[dict], root: Path) -> str:
    """The rows of every variant file in ``docs`` (its default's runs read from ``root / variant_of``), under one
    header, then what each file varied."""
    head = "| the default with | cell | seeds | " + " | ".join(m.label for m in METRICS) + " |"
    out = [head, "|---" * (len(METRICS) + 3) + "|"]
    sources = []
    for doc in docs:
        default = json.loads((root / doc["variant_of"]).read_text())
        out += rows(doc, default)
        sources += [doc["variant_of"]] if doc["variant_of"] not in sources else []
    return "\n".join(out) + ("\n\nVariant - default over the same arrival seeds (paired, 95% interval; points for "
                             "shares, relative for times; in bold beyond the verdict's margin either way); the "
                             "default's runs from " + ", ".join(sources) + ".")
