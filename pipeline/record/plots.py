"""``latency.png``: what the profile measured and what the route serves, readable at a glance.

Two panels over batch size (log 2):

- **latency**: one line per backend, each cell's p10-p90 spread as a whisker (whiskers do not blur
  into each other as shaded bands do), noisy cells drawn hollow, the routed model as a black dashed
  line, the reference peer (the user's own ``torch.compile``) dotted; plain-millisecond ticks (``0.5``, ``1``, ``2``), not powers of ten; candidates the screen dropped
  (``pipeline.measure.screening``) greyed, dashed, at the sizes the screen timed, with a legend entry each, so a
  backend that did not go on to the profile is seen not to, not missing; cells measured on a busy host ringed in red;
- **speed-up over eager** (over the first backend where there is no ``eager``): each backend's
  ``eager ms / its ms`` per batch size, the routed model in black, and each routed range shaded
  with the name of the backend that serves it written inside; a ratio that rests on a cell measured on a busy host
  (either side's) ringed in red.

Where any cell was measured on a busy host (``pipeline.measure.contention``), the title says how many
(:func:`contended_title`, drawn in red): a speed-up there measures the other jobs as much as the model.

Drawn on a bare Agg canvas (no pyplot), so it works headless and never changes the caller's
matplotlib backend.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Sequence, Set, Tuple

from pipeline.route.policy import Range, backend_for

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# backend -> batch size -> (p10 ms, p90 ms)
Bands = Mapping[str, Mapping[int, Tuple[float, float]]]
Medians = Mapping[str, Mapping[int, float]]
BASELINE = "eager"
NOISY_LABEL = "hollow: noisy cell (profile.csv says why)"
CONTENDED_LABEL = "red ring: measured on a busy host (contended)"
CONTENDED_COLOR = "red"
CONTENDED_HEAD = "CONTENDED:"  # how the title's second line begins where cells were measured on a busy host
REFERENCE_LABEL = "reference: your own torch.compile"
SCREENED = "grey"
SCREENED_MARKERS = ("s", "^", "v", "D", "P", "X")  # one per screened-out candidate, all grey


def plain_ticks(ax: "Axes") -> None:
    """Log-scale y ticks at 1, 2, 5 x 10^k, written as plain numbers (``0.2``, ``5``, ``20``)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def spread(name: str, names: Sequence[str]) -> float:
    """A small multiplicative x offset per backend, so that whiskers at one batch size stand side by side."""
    return 2 ** (0.06 * (names.index(name) - (len(names) - 1) / 2))


def draw_screened(ax: "Axes", screened: Medians) -> None:
    """Each screened-out candidate's screen medians, grey and dashed, labelled as screened out."""
    for i, (name, per) in enumerate(screened.items()):
        xs = sorted(per)
        ax.plot(xs, [per[x] for x in xs], color=SCREENED, ls="--", lw=1, alpha=0.7, zorder=2,
                marker=SCREENED_MARKERS[i % len(SCREENED_MARKERS)], ms=5, label=f"{name} (screened out; screen ms)")


def ring(ax: "Axes", points: Sequence[Tuple[float, float]]) -> None:
    """A red ring around each point: a figure that rests on a cell measured on a busy host."""
    if points:
        ax.plot(*zip(*points), marker="o", ms=11, ls="none", mfc="none", mec=CONTENDED_COLOR, mew=1.5, zorder=5)


def draw_latency(ax: "Axes", medians: Medians, bands: Bands, noisy: Mapping[str, Set[int]],
                 routed: Sequence[Tuple[int, float]], screened: Optional[Medians] = None,
                 references: Sequence[str] = (), contended: Optional[Mapping[str, Set[int]]] = None) -> Dict[str, Any]:
    """The latency panel (the reference peer's lines dotted and named as the user's own compile); returns each
    backend's colour."""
    names, colors, contended = list(medians), {}, contended or {}
    for name, per in medians.items():
        xs = sorted(per)
        shift = spread(name, names)
        label, style = (f"{name} ({REFERENCE_LABEL})", ":") if name in references else (name, "-")
        (line,) = ax.plot([x * shift for x in xs], [per[x] for x in xs], label=label, lw=1.5, ls=style)
        colors[name] = line.get_color()
        band = bands.get(name, {})
        with_band = [x for x in xs if x in band]
        if with_band:
            ax.errorbar([x * shift for x in with_band], [per[x] for x in with_band], fmt="none", capsize=3, lw=1,
                        ecolor=colors[name], alpha=0.6,
                        yerr=[[per[x] - band[x][0] for x in with_band], [band[x][1] - per[x] for x in with_band]])
        for x in xs:
            hollow = x in noisy.get(name, set())
            ax.plot(x * shift, per[x], marker="o", ms=6, color=colors[name], mfc="white" if hollow else colors[name],
                    mew=1.5, zorder=3)
        ring(ax, [(x * shift, per[x]) for x in xs if x in contended.get(name, set())])
    draw_screened(ax, screened or {})
    if routed:
        ax.plot(*zip(*routed), color="black", ls="--", lw=1.5, marker="x", label="auto (routed)", zorder=4)
    if any(noisy.get(name) for name in medians):
        ax.plot([], [], marker="o", ls="none", color="grey", mfc="white", label=NOISY_LABEL)
    if any(contended.get(name) for name in medians):
        ax.plot([], [], marker="o", ls="none", mfc="none", mec=CONTENDED_COLOR, mew=1.5, label=CONTENDED_LABEL)
    ax.set_yscale("log")
    plain_ticks(ax)
    ax.set_ylabel("median latency (ms)\nwhiskers: p10-p90")
    ax.legend(fontsize=8)
    return colors


def draw_speedup(ax: "Axes", medians: Medians, baseline: str, colors: Mapping[str, Any],
                 route: Optional[Sequence[Range]], routed: Sequence[Tuple[int, float]], edges: Tuple[float, float],
                 contended: Optional[Mapping[str, Set[int]]] = None) -> None:
    """The speed-up panel: every backend and the routed model against ``baseline``, routed ranges named, a ratio
    that rests on a contended cell (its own or the baseline's) ringed."""
    from matplotlib.ticker import FuncFormatter

    contended = contended or {}
    base, busy_base = medians[baseline], contended.get(baseline, set())
    values = [1.0]
    for name, per in medians.items():
        xs = [x for x in sorted(per) if x in base]
        values += [base[x] / per[x] for x in xs]
        ax.plot(xs, [base[x] / per[x] for x in xs], marker="o", ms=4, lw=1, color=colors[name], alpha=0.8)
        ring(ax, [(x, base[x] / per[x]) for x in xs if x in contended.get(name, set()) | busy_base])
    span = max(values) - min(values) or 1.0
    ax.set_ylim(min(values) - 0.08 * span, max(values) + 0.3 * span)  # headroom for the range names
    auto = [(x, base[x] / ms) for x, ms in routed if x in base]
    if auto:
        ax.plot(*zip(*auto), color="black", lw=2, marker="x", label="auto (routed)")
        ax.legend(fontsize=8, loc="upper right")
    ax.axhline(1.0, color="grey", lw=1, ls=":")
    for r in route or ():
        left = max(r.lo - 0.5, edges[0])
        right = edges[1] if r.hi is None else min(r.hi + 0.5, edges[1])
        if right <= left:
            continue
        ax.axvspan(left, right, color=colors.get(r.backend, "grey"), alpha=0.12, lw=0)
        ax.axvline(left, color="grey", lw=0.8, alpha=0.6)
        ax.text((left * right) ** 0.5, 0.95, r.backend, transform=ax.get_xaxis_transform(), ha="center", va="top",
                fontsize=9, fontweight="bold", color=colors.get(r.backend, "black"),
                bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1.5})
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.set_ylabel(f"speed-up over {baseline}\n(shaded: who serves)")


def contended_title(title: str, contended: Mapping[str, Set[int]]) -> str:
    """``title``, and where any cell was measured on a busy host, a second line that says so."""
    count = sum(len(sizes) for sizes in contended.values())
    return (f"{title}\n{CONTENDED_HEAD} {count} cell(s) measured on a busy host (ringed); their speed-ups measure the "
            f"other jobs too" if count else title)


def latency_figure(medians: Medians, route: Optional[Sequence[Range]], title: str = "",
                   bands: Optional[Bands] = None, noisy: Optional[Mapping[str, Set[int]]] = None,
                   screened: Optional[Medians] = None, references: Sequence[str] = (),
                   contended: Optional[Mapping[str, Set[int]]] = None) -> "Figure":
    """The figure: ``medians`` is backend -> batch size -> median ms, ``bands`` each cell's p10-p90,
    ``noisy`` backend -> the batch sizes whose cells the profile flagged, ``screened`` each screened-out
    candidate's screen medians (batch size -> ms), ``references`` the reference peer's candidates, ``contended``
    backend -> the batch sizes measured on a busy host."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullFormatter

    fig = Figure(figsize=(8, 7), dpi=110)
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    sizes = sorted({bs for per in medians.values() for bs in per})
    owners = {bs: backend_for(route, bs) for bs in sizes} if route else {}
    routed = [(bs, medians[b][bs]) for bs, b in owners.items() if bs in medians.get(b, {})]
    contended = contended or {}
    colors = draw_latency(top, medians, bands or {}, noisy or {}, routed, screened, references, contended)
    edges = (sizes[0] / 1.5, sizes[-1] * 1.5) if sizes else (0.5, 2.0)
    draw_speedup(bottom, medians, BASELINE if BASELINE in medians else next(iter(medians)), colors, route, routed,
                 edges, contended)
    bottom.set_xscale("log", base=2)
    bottom.set_xticks(sizes, [str(s) for s in sizes])
    bottom.xaxis.set_minor_formatter(NullFormatter())
    bottom.set_xlim(*edges)
    bottom.set_xlabel("batch size")
    top.set_title(title, **({"color": CONTENDED_COLOR} if CONTENDED_HEAD in title else {}))
    for ax in (top, bottom):
        ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    return fig


def latency_plot(medians: Medians, route: Optional[Sequence[Range]], path: Path, title: str = "",
                 bands: Optional[Bands] = None, noisy: Optional[Mapping[str, Set[int]]] = None,
                 screened: Optional[Medians] = None, references: Sequence[str] = (),
                 contended: Optional[Mapping[str, Set[int]]] = None) -> Path:
    """Write :func:`latency_figure` as a PNG to ``path`` and return it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    latency_figure(medians, route, title, bands, noisy, screened, references, contended).savefig(path)
    return path
