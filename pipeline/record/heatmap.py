"""The (batch size x length) table where lengths are tuned: which backend serves each tuned cell and how much
faster than eager it is there, as ``latency.png`` (two heatmaps) and as a Markdown grid for the report.

Before a route exists (the profile's end), each cell shows its fastest backend. Drawn on a bare Agg canvas
(no pyplot), as ``pipeline.record.plots`` is.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Mapping, Optional, Sequence, Tuple

from pipeline.route.table import Tile, backend_at

if TYPE_CHECKING:
    from matplotlib.figure import Figure

Cell = Tuple[int, int]  # (batch size, length)


def grid(medians: Mapping[str, Mapping[Cell, float]], table: Optional[Sequence[Tile]], baseline: Optional[str]
         ) -> Tuple[List[int], List[int], Dict[Cell, Tuple[str, float]]]:
    """The lengths, the batch sizes, and per profiled cell (the backend serving it, eager's median over that
    backend's: its speed-up, NaN where eager was not timed there)."""
    keys = sorted({key for per in medians.values() for key in per})
    cells: Dict[Cell, Tuple[str, float]] = {}
    for key in keys:
        timed = {b: per[key] for b, per in medians.items() if key in per}
        owner = backend_at(table, *key) if table else None
        owner = owner if owner in timed else min(timed, key=timed.get)
        eager = medians.get(baseline or "", {}).get(key)
        cells[key] = (owner, eager / timed[owner] if eager else math.nan)
    return sorted({n for _, n in keys}), sorted({bs for bs, _ in keys}), cells


def heatmap_figure(medians: Mapping[str, Mapping[Cell, float]], table: Optional[Sequence[Tile]],
                   baseline: Optional[str], title: str = "") -> "Figure":
    """Left: the backend serving each (batch size, length), one colour per backend; right: its speed-up over
    eager (green faster, red slower), each cell labelled."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import ListedColormap, TwoSlopeNorm
    from matplotlib.figure import Figure

    lengths, sizes, cells = grid(medians, table, baseline)
    names = list(dict.fromkeys(b for b, _ in cells.values()))
    fig = Figure(figsize=(5 + 1.6 * len(sizes), 1.5 + 0.8 * len(lengths)), dpi=110)
    FigureCanvasAgg(fig)
    owners_ax, speed_ax = fig.subplots(1, 2)
    colors = [f"C{i % 10}" for i in range(len(names))]
    speed = [[math.log2(cells[(bs, n)][1]) if (bs, n) in cells and cells[(bs, n)][1] > 0 else math.nan
              for bs in sizes] for n in lengths]  # log2: 2x faster and 2x slower lie as far from 1x
    reach = max([abs(v) for row in speed for v in row if v == v] + [0.1])
    owners_ax.imshow([[names.index(cells[(bs, n)][0]) if (bs, n) in cells else math.nan for bs in sizes]
                      for n in lengths], cmap=ListedColormap(colors), vmin=-0.5, vmax=len(names) - 0.5,
                     aspect="auto", origin="lower", alpha=0.55)
    speed_ax.imshow(speed, cmap="RdYlGn", norm=TwoSlopeNorm(0.0, -reach, reach), aspect="auto", origin="lower")
    for i, n in enumerate(lengths):
        for j, bs in enumerate(sizes):
            if (bs, n) not in cells:
                continue
            owner, ratio = cells[(bs, n)]
            owners_ax.text(j, i, owner, ha="center", va="center", fontsize=7)
            speed_ax.text(j, i, f"{owner}\n{ratio:.2f}x" if ratio == ratio else owner, ha="center", va="center",
                          fontsize=7)
    for ax, what in ((owners_ax, "routed backend" if table else "fastest backend (no route yet)"),
                     (speed_ax, f"speed-up over {baseline or 'eager'}")):
        ax.set_xticks(range(len(sizes)), [str(s) for s in sizes])
        ax.set_yticks(range(len(lengths)), [str(n) for n in lengths])
        ax.set_xlabel("batch size")
        ax.set_ylabel("length")
        ax.set_title(what, fontsize=9)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def heatmap_plot(medians: Mapping[str, Mapping[Cell, float]], table: Optional[Sequence[Tile]],
                 baseline: Optional[str], path: Path, title: str = "") -> Path:
    """Write :func:`heatmap_figure` as a PNG to ``path`` and return it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    heatmap_figure(medians, table, baseline, title).savefig(path)
    return path


def markdown_grid(medians: Mapping[str, Mapping[Cell, float]], table: Optional[Sequence[Tile]],
                  baseline: Optional[str]) -> str:
    """The same table in Markdown: a row per length, a column per batch size, ``backend 1.80x`` in each cell."""
    lengths, sizes, cells = grid(medians, table, baseline)
    lines = ["| length \\ batch | " + " | ".join(map(str, sizes)) + " |", "|---|" + "---|" * len(sizes)]
    for n in lengths:
        row = []
        for bs in sizes:
            owner, ratio = cells.get((bs, n), ("", math.nan))
            row.append(f"{owner} {ratio:.2f}x" if ratio == ratio else owner)
        lines.append(f"| {n} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"
