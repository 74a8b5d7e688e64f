"""README's architecture picture, drawn with matplotlib: clients, the router and its prefix index, the replicas
as Ray actors, and the KV events that flow back from the replicas to the router.

``python -m kvmesh.cluster.measure.architecture_figure`` writes docs/architecture.png (``--out`` elsewhere);
the same inputs give the same picture."""

from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parents[2] / "docs" / "architecture.png"

CLIENTS = "clients\nOpenAI API\nover HTTP, SSE"
ROUTER = "router\nprefix index per replica\n(fed by KV events)\npolicy cache_aware_tokens,\nadmission, tenants"
REPLICAS = [f"replica {i}\nengine: scheduler, paged KV cache,\nprefix caching, TP worker actors" for i in ("0", "1",
                                                                                                           "N-1")]
RAY = "Ray: places the replicas on GPUs (or CPUs) and restarts them"
EVENTS = ("KV events over ZeroMQ PUB\nBlockStored / BlockRemoved / AllBlocksCleared\n"
          "(+ replay / snapshot on a ROUTER socket)")
LABELS = (CLIENTS, ROUTER, *REPLICAS, RAY, EVENTS)
"""Every text the picture shows."""


def _box(ax, x: float, y: float, w: float, h: float, text: str, color: str) -> None:
    from matplotlib.patches import FancyBboxPatch

    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.15", fc=color, ec="0.25"))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=9)


def _arrow(ax, start: tuple[float, float], end: tuple[float, float], style: str = "-", color: str = "0.2") -> None:
    ax.annotate("", xy=end, xytext=start,
                arrowprops={"arrowstyle": "-|>", "linestyle": style, "color": color, "lw": 1.4})


def _replicas(ax) -> None:
    from matplotlib.patches import Rectangle

    ax.add_patch(Rectangle((7.1, 0.3), 4.9, 6.0, fc="#f3f3f3", ec="0.5", ls="--"))
    ax.text(9.55, 0.5, RAY, ha="center", va="bottom", fontsize=8, style="italic")
    for i, text in enumerate(REPLICAS):
        y = 4.6 - 1.85 * i
        _box(ax, 7.5, y, 4.1, 1.35, text, "#cfe3f7")
        _arrow(ax, (6.3, 3.6), (7.5, y + 0.8))
        _arrow(ax, (7.5, y + 0.4), (6.3, 2.6), style="--", color="tab:green")


def draw(path: str | Path = DEFAULT_OUT) -> Path:
    """Draw the picture into ``path`` (PNG) and return it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11.5, 4.6))
    ax.set_xlim(0, 12.2)
    ax.set_ylim(0, 6.5)
    ax.axis("off")
    _box(ax, 0.1, 2.45, 1.9, 1.5, CLIENTS, "#eeeeee")
    _box(ax, 2.7, 2.0, 3.6, 2.4, ROUTER, "#d6efd0")
    _arrow(ax, (2.0, 3.2), (2.7, 3.2))
    _replicas(ax)
    ax.text(4.5, 0.9, EVENTS, ha="center", va="center", fontsize=8, color="tab:green")
    ax.text(6.55, 5.4, "HTTP, the prompt's\ntoken ids", ha="center", fontsize=8)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="PNG to write (default: docs/architecture.png)")
    print(draw(parser.parse_args(argv).out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
