"""Screening: a short look at every candidate before the full profile, so time goes where the route is decided.

Every precision and template multiplies the candidates, and most of them are clearly slower than the
best somewhere on the grid of batch sizes, or everywhere. One short interleaved window per candidate at
the smallest, a middle and the largest tuned size (``profile.screen_budget_ms``) shows which ones: a
candidate is screened out when, at every screened size, even its interval's low end is ``screen_margin``
times (1.5x) above the high end of the fastest candidate that may serve there. Such a candidate would
need to be faster than the best by that margin somewhere between the screened sizes, where it was
slower at both neighbours, to change the route. Screened-out candidates keep their screen numbers and
the reason (``route.json``'s ``screened_out``, MLflow); nothing is dropped silently.

Plain eager is never screened out: it is the baseline the route must not lose to. A candidate outside
the accuracy budget cannot serve, so the screen's numbers are all it is timed for. A cell measured on a busy
host (``contended``: ``pipeline.measure.contention``) shows nothing: a candidate with one at a screened size
is kept, and none sets the pace.
"""

from __future__ import annotations

import math
from typing import Any, Collection, Dict, List, Mapping, Sequence

from pipeline.config.schema import ProfileConfig
from pipeline.measure.measurement import Measurement
from pipeline.seqlen import words


def screen_sizes(sizes: Sequence[int]) -> List[int]:
    """The smallest, the largest, and the tuned size nearest their geometric middle."""
    ordered = sorted(set(int(b) for b in sizes))
    middle = math.sqrt(ordered[0] * ordered[-1])
    between = min(ordered[1:-1], key=lambda b: (abs(math.log(b / middle)), b), default=None)
    return sorted({ordered[0], ordered[-1], *([between] if between is not None else [])})


def screen_settings(cfg: Mapping[str, Any]) -> Dict[str, Any]:
    """The profile's stop rules for one short window: ``screen_budget_ms``, one pass, no repeats."""
    defaults = ProfileConfig()
    budget = float(cfg.get("screen_budget_ms", defaults.screen_budget_ms))
    warmup = min(float(cfg.get("warmup_ms", defaults.warmup_ms)), budget / 2)
    return {**dict(cfg), "budget_ms": budget, "warmup_ms": warmup, "passes": 1, "max_repeats": 0,
            "min_window_ms": min(float(cfg.get("min_window_ms", defaults.min_window_ms)), budget)}


def shown(per: Mapping[int, Measurement], bs: int) -> bool:
    """Whether a candidate's cells show its speed at ``bs``: measured there, on a host that was not busy."""
    return bs in per and bool(per[bs].count) and not per[bs].contended


def screened_out(cells: Mapping[str, Mapping[int, Measurement]], servable: Collection[str], keep: Collection[str],
                 margin: float) -> Dict[str, str]:
    """Candidate -> why it is screened out: slower than the fastest servable candidate by ``margin`` at every
    screened size, beyond both intervals. ``keep`` are never screened out; a candidate without a cell at
    some screened size, or with a contended one, is kept (nothing shows it slow there)."""
    sizes = sorted({bs for per in cells.values() for bs in per})
    best: Dict[int, str] = {}
    for bs in sizes:
        timed = [n for n in servable if shown(cells.get(n, {}), bs)]
        if timed:
            best[bs] = min(timed, key=lambda n: cells[n][bs].median)
    out: Dict[str, str] = {}
    for name, per in cells.items():
        if name in keep or not sizes or any(not shown(per, bs) or bs not in best for bs in sizes):
            continue
        ratios = {}
        for bs in sizes:
            if best[bs] == name:
                break
            low, high = per[bs].interval[0], cells[best[bs]][bs].interval[1]
            if not low >= margin * high:
                break
            ratios[bs] = (per[bs].median / cells[best[bs]][bs].median, best[bs])
        else:
            out[name] = "screened out: " + ", ".join(
                f"{ratio:.2f}x slower than {by} at {words(key)}" for key, (ratio, by) in ratios.items()) + (
                f" (beyond both intervals; screen margin {margin:g}x)")
    return out


def numerics_out(cells: Mapping[str, Mapping[Any, Measurement]], numerics: Mapping[str, str],
                 servable: Collection[str], margin: float) -> Dict[str, str]:
    """Precision first: numerics (a precision with its weights, ``bf16-weights``) -> why its compiling candidates are
    not worth building. Each numerics is timed by its fastest servable candidate at each cell (``cells``: of the
    candidates that compile nothing, by name; ``numerics``: each one's), and screened out as a candidate would be:
    ``margin`` slower than the fastest numerics at every screened size, beyond both intervals. Where one of its
    cells at a size was measured on a busy host (or not at all), that cell stands for the numerics there: it keeps
    it, and sets no pace."""
    best: Dict[str, Dict[Any, Measurement]] = {}
    fastest: Dict[str, Dict[Any, str]] = {}
    for name, per in cells.items():
        if name not in servable:
            continue
        group = numerics[name]
        for key in per:
            held = best.get(group, {}).get(key)
            if held is None or (shown(best[group], key) and (not shown(per, key) or per[key].median < held.median)):
                best.setdefault(group, {})[key] = per[key]
                fastest.setdefault(group, {})[key] = name
    out = screened_out(best, list(best), (), margin)
    return {group: f"{', '.join(sorted(set(fastest[group].values())))} at {group}, the fastest that compile nothing, "
                   + why.removeprefix("screened out: ") for group, why in out.items()}
