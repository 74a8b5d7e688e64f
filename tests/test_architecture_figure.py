"""docs/architecture.png, README's picture, is what ``python -m kvmesh.cluster.measure.architecture_figure``
draws, and it names the parts README's text diagram names."""

from __future__ import annotations

import struct
from pathlib import Path

from kvmesh.cluster.measure.architecture_figure import DEFAULT_OUT, LABELS, draw, main

REPO = Path(__file__).resolve().parent.parent


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def test_the_committed_picture_is_the_one_the_command_draws(tmp_path):
    drawn = draw(tmp_path / "architecture.png")
    assert DEFAULT_OUT == REPO / "docs" / "architecture.png"
    assert _png_size(drawn) == _png_size(DEFAULT_OUT), \
        "regenerate: python -m kvmesh.cluster.measure.architecture_figure"


def test_the_picture_names_what_the_text_diagram_names():
    readme = (REPO / "README.md").read_text()
    text = " ".join(LABELS)
    for part in ("router", "replica 0", "replica N-1", "ZeroMQ PUB", "BlockStored", "BlockRemoved",
                 "AllBlocksCleared", "replay / snapshot", "Ray"):
        assert part in readme and part in text, part
    assert "docs/architecture.png" in readme


def test_the_command_writes_where_it_is_told(tmp_path, capsys):
    assert main(["--out", str(tmp_path / "sub" / "a.png")]) == 0
    assert (tmp_path / "sub" / "a.png").stat().st_size > 10_000
    assert "a.png" in capsys.readouterr().out
