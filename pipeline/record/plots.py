"""Latency against batch size: one line per backend on log axes with its p10-p90 band, the routed
ranges shaded and labelled.

Drawn on a bare Agg canvas (no pyplot), so it works headless and never changes the caller's
matplotlib backend.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Optional, Sequence, Tuple

from pipeline.route.policy import Range, backend_for

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# backend -> batch size -> (p10 ms, p90 ms)
Bands = Mapping[str, Mapping[int, Tuple[float, float]]]


def latency_figure(medians: Mapping[str, Mapping[int, float]], route: Optional[Sequence[Range]], title: str = "",
                   bands: Optional[Bands] = None) -> "Figure":
    """The figure: ``medians`` is backend -> batch size -> median ms; ``bands`` each backend's p10-p90
    spread, drawn as a shaded band labelled ``<backend> p10-p90`` so that a wide one is seen at once."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullFormatter

    fig = Figure(figsize=(8, 5), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    colors = {}
    sizes = sorted({bs for per in medians.values() for bs in per})
    for name, per in medians.items():
        xs = sorted(per)
        (line,) = ax.plot(xs, [per[x] for x in xs], marker="o", label=name)
        colors[name] = line.get_color()
        band = (bands or {}).get(name, {})
        xb = [x for x in xs if x in band]
        if xb:
            ax.fill_between(xb, [band[x][0] for x in xb], [band[x][1] for x in xb], color=colors[name], alpha=0.15,
                            lw=0, label=f"{name} p10-p90")
    if route and sizes:
        lo_edge, hi_edge = sizes[0] / 1.5, sizes[-1] * 1.5
        for r in route:
            left = max(r.lo - 0.5, lo_edge)
            right = hi_edge if r.hi is None else min(r.hi + 0.5, hi_edge)
            if right <= left:
                continue
            ax.axvspan(left, right, color=colors.get(r.backend, "grey"), alpha=0.12, lw=0)
            ax.text((left * right) ** 0.5, 1.0, r.backend, transform=ax.get_xaxis_transform(), ha="center",
                    va="bottom", fontsize=8, color=colors.get(r.backend, "black"))
        owners = {bs: backend_for(route, bs) for bs in sizes}
        routed = [(bs, medians[b][bs]) for bs, b in owners.items() if bs in medians.get(b, {})]
        if routed:
            ax.plot(*zip(*routed), color="black", ls="--", lw=1.5, marker="x", label="auto (routed)")
        ax.set_xlim(lo_edge, hi_edge)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("batch size")
    ax.set_ylabel("median latency (ms)")
    ax.set_title(title, pad=16)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def latency_plot(medians: Mapping[str, Mapping[int, float]], route: Optional[Sequence[Range]], path: Path,
                 title: str = "", bands: Optional[Bands] = None) -> Path:
    """Write :func:`latency_figure` as a PNG to ``path`` and return it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    latency_figure(medians, route, title, bands).savefig(path)
    return path
