"""The route the profile so far gives, and the cells it rests on: what the route stage ships, and what the
profile re-measures (a noisy cell is worth another window only where the route rests on it). Where lengths
are tuned, the route is a (batch range x length range) table (``pipeline.route.table``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Set, Tuple, Union

from pipeline.backends.precision import precision_of
from pipeline.context import RunContext
from pipeline.measure.padding import PROVED
from pipeline.route import table
from pipeline.route.policy import Range, choose_route, eager_baseline, rests_on, usable

TIMED = ("router", "highest_throughput")  # the strategies whose choice rests on the profile's timings


@dataclass(frozen=True)
class Decision:
    route: Union[List[Range], List[table.Tile]]  # tiles where lengths are tuned
    baseline: Optional[str]  # the eager candidate no profiled size is served slower than
    failures: Dict[str, str]  # candidates that may not serve, and why
    rests_on: List[Tuple[str, Any]]  # (candidate, cell): the cells the route's choices rest on


def contested(cells: List[Tuple[str, Any]]) -> Dict[Any, List[str]]:
    """Cell -> the candidates whose cells a choice rests on, where more than the owner's does (another
    candidate's interval overlaps the owner's): only there can a re-measure or a quieter host change the route."""
    at: Dict[Any, List[str]] = {}
    for name, bs in cells:
        if name not in at.setdefault(bs, []):
            at[bs].append(name)
    return {bs: names for bs, names in at.items() if len(names) > 1}


def baseline(ctx: RunContext) -> Optional[str]:
    """Plain eager at fp32 where it competes (else the first eager candidate): the route never loses to it."""
    candidates = ctx.candidates
    return (eager_baseline({n: c for n, c in candidates.items() if precision_of(c) == "fp32"})
            or eager_baseline(candidates))


def any_length(ctx: RunContext) -> Set[str]:
    """The candidates that may serve untuned lengths: padding proved, or running any length unpadded."""
    return {n for n, o in ctx.outcomes.items() if o.padding == PROVED or o.any_length}


def decide(ctx: RunContext) -> Decision:
    """The configured strategy over the profile's medians and intervals (``pipeline.route.policy``; in two
    dimensions ``pipeline.route.table``)."""
    rcfg = ctx.cfg.route
    medians, intervals = ctx.medians(), ctx.intervals()
    order, failures, eager = list(ctx.candidates), ctx.failures(), baseline(ctx)
    competed = {b: medians[b] for b in usable(medians, order, failures)}
    timed = rcfg.strategy in TIMED
    if ctx.lengths:
        tiles = table.choose_table(medians, order, ctx.lengths, rcfg.strategy, rcfg.min_gain, any_length(ctx),
                                   rcfg.backend, failures, baseline=eager, intervals=intervals)
        return Decision(tiles, eager, failures, table.rests_on(tiles, competed, intervals) if timed else [])
    route = choose_route(medians, order, rcfg.strategy, rcfg.min_gain, rcfg.backend, failures,
                         baseline=eager, intervals=intervals)
    return Decision(route, eager, failures, rests_on(route, competed, intervals) if timed else [])
